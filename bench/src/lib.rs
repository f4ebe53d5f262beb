//! What the benchmarks of Orchard Env share beyond `orchard-bench-support`: the sections they write
//! into `docs/BENCHMARKS.md` ([`docs`]), the summary of kube-apiserver's audit log ([`audit_summary`])
//! the callgrind driver ([`callgrind`]), the counting allocator ([`alloc`]), what one object takes in a watch cache ([`cache_heap`]), the CPU time of in-process hops by thread name ([`thread_cpu`]) and the least HTTP-aware hop `bench_gateway` measures ([`lean_proxy`]). The binaries (`bench-scale`, `bench-queue`,
//! `bench-lifecycle`, `bench-pool`, `bench-real`, `bench-control-plane`, `soak`) and the examples (`bench_gateway`,
//! `bench_callgrind`) run on the local test cluster of `orchard-testcluster`; `bench-egress` runs the
//! egress proxy on loopback with no cluster. The Makefile's `bench-*` and `soak` targets start them
//! (docs/BENCHMARKS.md).

pub mod alloc;
pub mod audit_summary;
pub mod cache_heap;
pub mod callgrind;
pub mod control_plane;
pub mod docs;
pub mod lean_proxy;
pub mod thread_cpu;
