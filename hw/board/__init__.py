"""The board: the accelerator on a real FPGA board, with its DRAM controller and host link.

The ECPIX-5 85F (:mod:`hw.board.ecpix5`) carries the accelerator beside a LiteDRAM DDR3
controller and a UART host link::

    host (sim.board driver) --UART--> HostLink (hw/board/link.py) --+--> imem_wr, start, status
                                                                    +--> native port 1 (host access)
                                                                    +--> LiteDRAM control bus
    Accelerator (hw/top.py), clock-enabled --DramSignature--> DramBridge (hw/board/bridge.py)
                                                                    +--> native port 0
    LiteDRAM core (generated Verilog, hw/board/litedram.py): native ports 0 and 1 -> DDR3

One clock domain: everything runs on LiteDRAM's ``sys`` clock (``user_clk`` of the generated
core, :attr:`hw.board.ecpix5.Board.sys_clk_hz`), so there is no clock-domain crossing. The
accelerator keeps its fixed-latency DRAM contract (:mod:`hw.dma`, :mod:`hw.timing`): the bridge
stalls the accelerator's clock enable whenever the memory is not ready for a request or a
response is not back when the contract says it is due, so the accelerator's own cycle count is
exactly the fast model's and a second counter measures the cycles lost to memory.

The native port's signature is :class:`hw.board.native.NativePortSignature`.
"""
