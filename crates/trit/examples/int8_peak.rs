//! Peak throughput of the int8 dot-product instructions on this CPU, per thread and for N
//! threads at once (are two threads two cores, or SMT siblings sharing one core's units?).
//!
//!     cargo run --release -p trit --example int8_peak [-- THREADS]
//!
//! Compare with the "all matmuls" GMAC/s of `trit bench --profile` (pp512): the fraction of
//! this peak the prefill GEMM reaches.

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("THREADS must be a number"))
        .unwrap_or(2);
    println!("| instruction | MACs/op | 1 thread Gop/s | 1 thread GMAC/s | {threads} threads GMAC/s (sum) |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for p in trit::kernels::peak::measure() {
        // The same probe on `threads` threads at once.
        let all: f64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| s.spawn(trit::kernels::peak::measure))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap()
                        .into_iter()
                        .find(|q| q.instruction == p.instruction)
                        .map_or(0.0, |q| q.gmacs())
                })
                .sum()
        });
        println!(
            "| {} | {} | {:.2} | {:.1} | {:.1} |",
            p.instruction,
            p.macs_per_op,
            p.ops_per_sec / 1e9,
            p.gmacs(),
            all
        );
    }
}
