"""Makes ``tests/sw`` importable (``compile_testutil``) from every test below it."""
