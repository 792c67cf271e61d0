//! Throughput of the offline reader on a file (what `vigil diagnose` does, without the CLI):
//! `cargo run --release -p vigil-core --example diagnose_speed -- FILE`.
fn main() {
    let path = std::env::args().nth(1).expect("FILE");
    let text = std::fs::read_to_string(&path).expect("read");
    let profiles = vigil_core::Profiles::builtin();
    let t0 = std::time::Instant::now();
    let r = vigil_core::diagnose_text(&profiles, None, &text);
    let dt = t0.elapsed().as_secs_f64();
    println!("{:.1} MiB/s ({:.2} s) verdict {:?}", text.len() as f64 / (1 << 20) as f64 / dt, dt, r.verdict);
}
