//! Sinks: where the typed event stream goes. `events` is the stream's schema; `report` renders it for
//! people (TTY, plain) and as JSON behind one redactor; `tables` renders the one-shot commands' rows;
//! `metrics` (Prometheus) and `notify` (sd_notify) follow the verdict; `history` records startups (and
//! gives the next watch its baseline); `timeline` draws one.

pub mod events;
pub mod history;
pub mod metrics;
pub mod notify;
pub mod records;
pub mod redact;
pub mod report;
pub mod tables;
pub mod timeline;
