//! Redaction: the one redactor every output goes through, and the pure rules it applies. A secret is the
//! value of a secret flag (`--api-key`, `--hf-token`, …, in the `--flag value` and `--flag=value`
//! shapes) or of a secret variable (`HF_TOKEN`, `*_API_KEY`, `*_TOKEN`, `*SECRET*`, `*PASSWORD*`).
//! [`redact`] splits a command and its environment into a redacted copy and the [`Secrets`] it held
//! (kept apart from the run record, to replay the command); [`Redactor`] hides the known values and any
//! secret flag's value in text. Where a run's secrets are stored is the node's business
//! (`node::run::redactor_for`).

use serde::{Deserialize, Serialize};

/// The secret values [`redact`] took out of a command and its environment (stored apart from the run
/// record, to replay the exact command).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Secrets {
    /// (index into argv, real value)
    pub argv: Vec<(usize, String)>,
    /// (variable, real value)
    pub env: Vec<(String, String)>,
}

/// Flags whose next argument (or `=value`) is a secret.
const SECRET_FLAGS: &[&str] = &["--api-key", "--hf-token", "--token", "--admin-api-key", "--api-keys"];

/// Is this environment variable a secret? (`HF_TOKEN`, `*_API_KEY`, `*_TOKEN`, `*_SECRET*`, `*PASSWORD*`)
pub fn secret_var(k: &str) -> bool {
    let u = k.to_ascii_uppercase();
    u == "HF_TOKEN"
        || u == "HUGGING_FACE_HUB_TOKEN"
        || u.ends_with("_API_KEY")
        || u == "API_KEY"
        || u.ends_with("_TOKEN")
        || u.contains("SECRET")
        || u.contains("PASSWORD")
}

/// Splits a command and an environment into a redacted copy and the secrets it held.
pub fn redact(argv: &[String], env: &[(String, String)]) -> (Vec<String>, Vec<(String, String)>, Secrets) {
    let mut s = Secrets::default();
    let mut out = argv.to_vec();
    let mut i = 0;
    while i < out.len() {
        let a = out[i].clone();
        if SECRET_FLAGS.contains(&a.as_str()) && i + 1 < out.len() {
            s.argv.push((i + 1, out[i + 1].clone()));
            out[i + 1] = "***".into();
            i += 2;
            continue;
        }
        if let Some((flag, val)) = a.split_once('=') {
            if SECRET_FLAGS.contains(&flag) {
                s.argv.push((i, a.clone()));
                out[i] = format!("{flag}=***");
                let _ = val;
            }
        }
        i += 1;
    }
    let env_out = env
        .iter()
        .map(|(k, v)| {
            if secret_var(k) && !v.is_empty() {
                s.env.push((k.clone(), v.clone()));
                (k.clone(), "***".into())
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect();
    (out, env_out, s)
}

/// A command line given as one string (from /proc), secret flag values replaced by `***`.
pub fn redact_cmdline(cmd: &str) -> String {
    redact(&cmd.split(' ').map(String::from).collect::<Vec<_>>(), &[]).0.join(" ")
}

/// The one redactor every output goes through (terminal, plain, JSON, logs, local and remote): the secret
/// values known for the run (stored apart from the run record) and the values of secret flags in any
/// `--flag value` / `--flag=value` shape.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    values: Vec<String>,
}

impl Redactor {
    pub fn from_secrets(s: &Secrets) -> Redactor {
        let mut r = Redactor::default();
        for v in secret_values(s) {
            r.add(&v);
        }
        r
    }

    /// A value that must never be printed (short values are not redacted: they would mangle text).
    pub fn add(&mut self, v: &str) {
        if v.len() >= 4 && !self.values.iter().any(|x| x == v) {
            self.values.push(v.to_string());
        }
    }

    pub fn redact(&self, s: &str) -> String {
        let mut out = s.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "***");
            }
        }
        if SECRET_FLAGS.iter().any(|f| out.contains(f)) {
            out = redact_cmdline(&out);
        }
        out
    }
}

/// Secret values as they appear in text (the `--flag=value` form contributes its value).
pub fn secret_values(s: &Secrets) -> Vec<String> {
    let mut v: Vec<String> = s
        .argv
        .iter()
        .map(|(_, a)| {
            a.split_once('=')
                .filter(|(f, _)| f.starts_with("--"))
                .map(|(_, v)| v.to_string())
                .unwrap_or_else(|| a.clone())
        })
        .chain(s.env.iter().map(|(_, v)| v.clone()))
        .filter(|v| v.len() >= 4)
        .collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// Every secret the README names (`--api-key`, `--hf-token`, `--token`, `HF_TOKEN`, `*_API_KEY`, `*_TOKEN`,
    /// `*SECRET*`, `*PASSWORD*`), in both flag shapes: out of the record, and out of any text the redactor sees.
    #[test]
    fn every_secret_the_readme_names_is_redacted() {
        let argv = strings(&["srv", "--api-key", "k-one", "--hf-token=hf-two", "--token", "t-three", "--port", "8000"]);
        let env: Vec<(String, String)> = [
            ("HF_TOKEN", "hf-env1"),
            ("OPENAI_API_KEY", "sk-env2"),
            ("github_token", "gh-env3"),
            ("MY_SECRET_SALT", "sec-env4"),
            ("DB_PASSWORD", "pw-env5"),
            ("PATH", "/usr/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (a, e, secrets) = redact(&argv, &env);
        assert_eq!(a, strings(&["srv", "--api-key", "***", "--hf-token=***", "--token", "***", "--port", "8000"]));
        for (k, v) in &e {
            assert_eq!(v == "***", k != "PATH", "{k}={v}");
        }
        let r = Redactor::from_secrets(&secrets);
        let text = "k-one hf-two t-three hf-env1 sk-env2 gh-env3 sec-env4 pw-env5 /usr/bin";
        assert_eq!(r.redact(text), "*** *** *** *** *** *** *** *** /usr/bin");
        // a secret flag's value in text with no record behind it (another process's command line)
        let none = Redactor::default();
        assert_eq!(none.redact("llama-server --api-key zz-9 --port 1"), "llama-server --api-key *** --port 1");
        assert_eq!(none.redact("x --hf-token=abc"), "x --hf-token=***");
    }
}
