//! Where a command runs: this machine, or every host of `--host/--hosts` (at most `--parallel` at once);
//! the commands are written once over `node::Node` and these run them on one node or many.

use crate::error::CliError;
use crate::exit::Exit;
use crate::node::{AnyNode, LocalNode, SshNode};

/// Where a command runs: this machine, or every host of `--host/--hosts`.
pub enum Nodes {
    Local,
    Remote(crate::supervise::hosts::Hosts),
}

impl Nodes {
    /// Several nodes: lines are tagged with their host.
    pub fn several(&self) -> bool {
        matches!(self, Nodes::Remote(h) if h.list.len() > 1)
    }

    /// The one node a command works on: this machine, or the single `--host` (connected).
    pub async fn one(&self, cmd: &str) -> Result<AnyNode, CliError> {
        match self {
            Nodes::Local => Ok(AnyNode::Local(LocalNode::default())),
            Nodes::Remote(hs) if hs.list.len() == 1 => Ok(AnyNode::Ssh(SshNode::open(&hs.ssh, &hs.list[0]).await?)),
            Nodes::Remote(_) => Err(CliError::usage(format!("{cmd}: give one --host"))),
        }
    }

    /// Runs `f` on every node (hosts at most `--parallel` at once, each over its own connection); the
    /// results in node order, each with the node's name.
    pub async fn each<T, F, Fut>(&self, f: F) -> Vec<(String, Result<T, CliError>)>
    where
        T: 'static,
        F: Fn(AnyNode) -> Fut + Clone + 'static,
        Fut: std::future::Future<Output = Result<T, CliError>> + 'static,
    {
        match self {
            Nodes::Local => vec![("local".into(), f(AnyNode::Local(LocalNode::default())).await)],
            Nodes::Remote(hs) => {
                let jobs: Vec<_> = hs
                    .list
                    .iter()
                    .map(|h| {
                        let (h, ssh, f) = (h.clone(), hs.ssh.clone(), f.clone());
                        move || async move {
                            let r = match SshNode::open(&ssh, &h).await {
                                Ok(n) => f(AnyNode::Ssh(n)).await,
                                Err(e) => Err(e),
                            };
                            (h, r)
                        }
                    })
                    .collect();
                crate::supervise::hosts::drive_fleet(hs.parallel, jobs).await
            }
        }
    }
}

/// One node: its result as is; several: errors printed per node, the worst code.
pub fn fold(mut v: Vec<(String, Result<Exit, CliError>)>) -> Result<Exit, CliError> {
    if v.len() == 1 {
        return v.pop().unwrap().1;
    }
    let mut code = Exit::Ready;
    for (h, r) in v {
        match r {
            Ok(c) => code = code.max(c),
            Err(e) => {
                code = code.max(e.code());
                eprintln!("vigil: {h}: {}", e.message());
            }
        }
    }
    Ok(code)
}

/// Rows gathered from every node, and the exit code: when every node failed, only their errors.
pub fn gather<T>(r: Vec<(String, Result<Vec<T>, CliError>)>) -> (Vec<T>, Result<Exit, CliError>) {
    let mut rows = Vec::new();
    let mut codes = Vec::new();
    for (h, x) in r {
        match x {
            Ok(v) => {
                rows.extend(v);
                codes.push((h, Ok(Exit::Ready)));
            }
            Err(e) => codes.push((h, Err(e))),
        }
    }
    (rows, fold(codes))
}
