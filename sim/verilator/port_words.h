// Verilated ports <-> little-endian 32-bit words, for both harnesses (harness.cpp,
// board_harness.cpp): a port of up to 64 bits is a plain integer, a wider one a VlWide.
#pragma once

#include <cstdint>
#include <cstring>

#include "verilated.h"

template <typename T>
inline void to_words(const T& v, uint32_t* w) {
    uint64_t x = static_cast<uint64_t>(v);
    w[0] = static_cast<uint32_t>(x);
    w[1] = static_cast<uint32_t>(x >> 32);
}
template <std::size_t N>
inline void to_words(const VlWide<N>& v, uint32_t* w) {
    std::memcpy(w, v.data(), 4 * N);
}
template <typename T>
inline void from_words(T& v, const uint32_t* w) {
    v = static_cast<T>(w[0] | (static_cast<uint64_t>(w[1]) << 32));
}
template <std::size_t N>
inline void from_words(VlWide<N>& v, const uint32_t* w) {
    std::memcpy(v.data(), w, 4 * N);
}
