//! The one error type of the commands: a usage error (exit 2), an internal one (exit 1), or an
//! unreachable host (exit 12), each printed as one line.

use crate::exit::Exit;

/// An error the user can act on (exit 2) or an internal one (exit 1), printed as one line.
#[derive(Debug)]
pub enum CliError {
    Usage(String),
    Internal(String),
    /// A remote host could not be reached, or the connection was lost for good (exit 12).
    Unreachable(String),
}

impl CliError {
    pub fn usage(s: impl Into<String>) -> CliError {
        CliError::Usage(s.into())
    }

    /// The exit code this error ends vigil (or one host's work) with.
    pub fn code(&self) -> Exit {
        match self {
            CliError::Usage(_) => Exit::Usage,
            CliError::Internal(_) => Exit::Internal,
            CliError::Unreachable(_) => Exit::Unreachable,
        }
    }

    /// The one-line message.
    pub fn message(self) -> String {
        match self {
            CliError::Usage(m) | CliError::Internal(m) | CliError::Unreachable(m) => m,
        }
    }
}
