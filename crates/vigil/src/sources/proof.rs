//! Proof of readiness: one real completion through the server's own API, and, when the command asks
//! for speculative decoding, proof that it is on (or a `degraded: speculation off` verdict).

use crate::probe::{self, Target};
use serde_json::Value;
use std::time::{Duration, Instant};
use vigil_core::profile::ProofSpec;
pub use vigil_core::proof::{Generation, SpecStats};

/// Does the command ask for speculative decoding?
pub fn wants_speculation(argv: &[String]) -> bool {
    let has = |f: &str| argv.iter().any(|a| a == f || a.starts_with(&format!("{f}=")));
    has("--speculative-algorithm")
        || has("--speculative-config")
        || has("-md")
        || has("--model-draft")
        || has("--spec-draft-model")
        || crate::follow::arg_value(argv, "--spec-type").is_some_and(|v| v != "none")
}

fn num(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_f64().map(|f| f as u64))
}

/// Tokens the proof asks for: two prove decoding (one prefill, one decode step, where CUDA-graph replay
/// runs) at the least cost; with speculative decoding, enough for the drafter to run several steps
/// (llama-server drafts up to 16 by default, EAGLE chains 3-8 steps) so that acceptance can be read.
pub fn proof_tokens(wants_spec: bool) -> u32 {
    if wants_spec {
        16
    } else {
        2
    }
}

/// The model a command serves (`serve MODEL`, `--model`, `--model-path`, `-m`), for OpenAI-style requests.
pub fn model_hint(argv: &[String]) -> Option<String> {
    crate::follow::arg_value(argv, "--model")
        .or_else(|| crate::follow::arg_value(argv, "--model-path"))
        .map(String::from)
        .or_else(|| {
            argv.iter()
                .position(|a| a == "serve")
                .and_then(|i| argv.get(i + 1))
                .filter(|m| !m.starts_with('-'))
                .cloned()
        })
}

/// Fills the profile's request body: `"$tokens"` becomes the token count, `"$model"` the model id.
fn fill(v: &Value, tokens: u32, model: Option<&str>) -> Value {
    match v {
        Value::String(s) if s == "$tokens" => Value::from(tokens),
        Value::String(s) if s == "$model" => Value::from(model.unwrap_or_default()),
        Value::Array(a) => Value::Array(a.iter().map(|x| fill(x, tokens, model)).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), fill(x, tokens, model))).collect()),
        other => other.clone(),
    }
}

/// The first of the JSON pointers that holds a value.
fn first<'a>(v: &'a Value, paths: &[String]) -> Option<&'a Value> {
    paths.iter().find_map(|p| v.pointer(p).filter(|x| !x.is_null()))
}

/// Sends one small greedy completion as the server kind's profile describes it (`[proof]`) and checks
/// that the answer has tokens; with speculation asked for, reads the speculation numbers too.
pub async fn generate_with(
    spec: &ProofSpec,
    t: &Target,
    timeout: Duration,
    bearer: Option<&str>,
    hint: Option<String>,
    tokens: u32,
    wants_spec: bool,
) -> Generation {
    let t0 = Instant::now();
    let fail = |endpoint: &str, note: String| Generation {
        ok: false,
        endpoint: endpoint.into(),
        tokens: 0,
        ms: t0.elapsed().as_millis() as u64,
        note,
        spec: None,
    };
    let model = if spec.needs_model {
        // OpenAI-compatible servers need the model id first.
        let model = match probe::request(t, "GET", "/v1/models", None, timeout, bearer).await {
            Ok((200, b)) => {
                serde_json::from_slice::<Value>(&b).ok().and_then(|v| v["data"][0]["id"].as_str().map(String::from))
            }
            _ => None,
        };
        let Some(model) = model.or(hint) else { return fail("/v1/models", "no model id from /v1/models".into()) };
        Some(model)
    } else {
        None
    };
    let endpoint = spec.endpoint.clone();
    let body = fill(&spec.body, tokens, model.as_deref());
    let (code, b) = match probe::request(t, "POST", &endpoint, Some(&body.to_string()), timeout, bearer).await {
        Ok(x) => x,
        Err(e) => return fail(&endpoint, e),
    };
    let ms = t0.elapsed().as_millis() as u64;
    if code != 200 {
        let snippet: String = String::from_utf8_lossy(&b).chars().take(200).collect();
        return Generation { ok: false, endpoint, tokens: 0, ms, note: format!("HTTP {code}: {snippet}"), spec: None };
    }
    let Ok(v) = serde_json::from_slice::<Value>(&b) else {
        return Generation { ok: false, endpoint, tokens: 0, ms, note: "answer is not JSON".into(), spec: None };
    };
    let count = first(&v, &spec.tokens).and_then(num).unwrap_or(0);
    let text_len = first(&v, &spec.text).and_then(Value::as_str).map_or(0, str::len);
    let mut stats = spec.drafted.as_deref().and_then(|d| v.pointer(d)).and_then(num).map(|drafted| {
        let accepted = spec.accepted.as_deref().and_then(|a| v.pointer(a)).and_then(num).unwrap_or(0);
        SpecStats::Counts { drafted, accepted }
    });
    let tokens = if count == 0 && text_len > 0 { 1 } else { count };
    if tokens == 0 {
        return Generation { ok: false, endpoint, tokens: 0, ms, note: "the answer has no tokens".into(), spec: stats };
    }
    if let (true, Some(ep)) = (wants_spec, &spec.accept_length_endpoint) {
        stats = accept_length(t, ep, &spec.accept_length, timeout, bearer)
            .await
            .map(|accept_length| SpecStats::AcceptLength { accept_length });
    }
    Generation { ok: true, endpoint, tokens, ms, note: format!("{tokens} tokens in {ms} ms"), spec: stats }
}

/// The average accept length a server publishes on its own endpoint (SGLang: `/server_info`).
async fn accept_length(
    t: &Target,
    endpoint: &str,
    paths: &[String],
    timeout: Duration,
    bearer: Option<&str>,
) -> Option<f64> {
    let (code, b) = probe::request(t, "GET", endpoint, None, timeout, bearer).await.ok()?;
    if code != 200 {
        return None;
    }
    let v: Value = serde_json::from_slice(&b).ok()?;
    first(&v, paths).and_then(Value::as_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_filled() {
        let body = serde_json::json!({"model": "$model", "n": "$tokens", "nested": {"max": "$tokens"}, "keep": 0});
        let b = fill(&body, 16, Some("m"));
        assert_eq!(b, serde_json::json!({"model": "m", "n": 16, "nested": {"max": 16}, "keep": 0}));
    }

    #[test]
    fn answers_are_read_by_pointer() {
        let v: Value = serde_json::json!({"timings": {"predicted_n": 3}, "content": "abc"});
        assert_eq!(first(&v, &["/tokens_predicted".into(), "/timings/predicted_n".into()]).and_then(num), Some(3));
    }
}
