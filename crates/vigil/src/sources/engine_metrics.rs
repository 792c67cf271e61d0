//! Reads the server's own Prometheus metrics (issue #17) for the judge: the names its profile gives
//! (`[server.metrics]`), parsed by `vigil_core::engine_metrics`. Only gathers; the judge decides.

use crate::sources::probe::{self, Target};
use std::time::Duration;
use tokio::sync::mpsc;
use vigil_core::engine_metrics::{self, MetricsSample};
use vigil_core::profile::MetricsSpec;

/// How often the page is read: the window (default 30 s) sees several readings.
pub const EVERY: Duration = Duration::from_secs(5);

/// Reads `spec`'s page on the server behind `health` every `EVERY` and sends what it finds (`None` when
/// the page is absent or holds none of the names: metrics off, the probes stay in charge).
pub fn spawn(
    health: &Target,
    spec: MetricsSpec,
    timeout: Duration,
    bearer: Option<String>,
    tx: mpsc::UnboundedSender<Option<MetricsSample>>,
) {
    let mut t = health.clone();
    t.path = spec.path.clone().unwrap_or_else(|| "/metrics".into());
    tokio::spawn(async move {
        loop {
            let got = match probe::request(&t, "GET", &t.path, None, timeout, bearer.as_deref()).await {
                Ok((200, body)) => engine_metrics::sample(&String::from_utf8_lossy(&body), &spec),
                _ => None,
            };
            if tx.send(got).is_err() {
                return;
            }
            tokio::time::sleep(EVERY).await;
        }
    });
}
