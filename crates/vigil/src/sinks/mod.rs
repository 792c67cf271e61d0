//! Sinks: where the typed event stream and the commands' records go. `sink` is the `Sink` trait, every
//! call a watch makes on its outputs (the reporter, the metrics, systemd, the run's verdict file and the
//! history recorder implement it); `events` is the stream's schema (and the payloads no lower layer owns);
//! `records` the one-shot commands' rows and reports; `report` renders the stream for people (TTY, plain)
//! and as JSON behind the one redactor of `redact`, into a writer it owns (stdout, or a buffer in tests);
//! `tables` renders the records; `metrics` (Prometheus) and `notify` (sd_notify) follow the verdict;
//! `listen` serves the stream and the state built from it over HTTP (`--listen`); `history` says what the
//! startup history means in words; `timeline` draws a startup. Sinks import only
//! each other, the base modules and `vigil_core`: every other layer may import them, and hands them values.

pub mod events;
pub mod history;
pub mod listen;
pub mod metrics;
pub mod notify;
pub mod records;
pub mod redact;
pub mod report;
pub mod sink;
pub mod tables;
pub mod timeline;
