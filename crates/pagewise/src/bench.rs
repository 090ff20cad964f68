//! Benchmarks of the capabilities, shared by `pagewise bench` and the benchmark programs.
