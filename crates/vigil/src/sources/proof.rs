//! Proof of readiness: one real completion through the server's own API, and, when the command asks
//! for speculative decoding, proof that it is on (or a `degraded: speculation off` verdict).

use crate::sources::probe::{self, Target};
use serde_json::Value;
use std::time::{Duration, Instant};
use vigil_core::profile::ProofSpec;
use vigil_core::proof;
pub use vigil_core::proof::Generation;

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
    crate::sources::follow::arg_value(argv, "--model")
        .or_else(|| crate::sources::follow::arg_value(argv, "--model-path"))
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

/// Sends one small greedy completion as the server kind's profile describes it (`[proof]`) and checks
/// that the answer has tokens; with speculation asked for (`read_spec`), gathers the speculation numbers
/// where the profile says they are: the answer itself, the engine's counters on its metrics page just
/// before and just after the request, or the server's average accept length. Only gathers: the core
/// (`vigil_core::proof`) reads the numbers and decides.
pub async fn generate_with(
    spec: &ProofSpec,
    t: &Target,
    timeout: Duration,
    bearer: Option<&str>,
    hint: Option<String>,
    tokens: u32,
    read_spec: bool,
) -> Generation {
    let t0 = Instant::now();
    let fail = |endpoint: &str, note: String| Generation {
        ok: false,
        endpoint: endpoint.into(),
        tokens: 0,
        ms: t0.elapsed().as_millis() as u64,
        note,
        spec: None,
        spec_note: None,
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
    // The engine's speculation counters just before the request (vLLM: they count every request).
    let counters = spec.speculation.as_ref().and_then(|s| s.metrics.as_ref()).filter(|_| read_spec);
    let metrics_path = counters.map(|m| m.path.clone().unwrap_or_else(|| "/metrics".into()));
    let before = match &metrics_path {
        Some(p) => Some(page(t, p, timeout, bearer).await),
        None => None,
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
        return fail(&endpoint, format!("HTTP {code}: {snippet}"));
    }
    let Ok(v) = serde_json::from_slice::<Value>(&b) else {
        return fail(&endpoint, "answer is not JSON".into());
    };
    let (tokens, mut stats) = proof::read_answer(spec, &v);
    if tokens == 0 {
        return Generation { spec: stats, ..fail(&endpoint, "the answer has no tokens".into()) };
    }
    let mut spec_note = None;
    if let (Some(p), Some(m), None) = (&metrics_path, counters, &stats) {
        match page(t, p, timeout, bearer).await {
            Ok(after) => {
                let before = before.and_then(Result::ok);
                match proof::metrics_delta(before.as_deref(), &after, m) {
                    Ok(s) => stats = Some(s),
                    Err(e) => spec_note = Some(format!("{e} ({p})")),
                }
            }
            Err(e) => spec_note = Some(e),
        }
    }
    if let (true, None, None, Some(ep)) = (read_spec, &stats, &spec_note, &spec.accept_length_endpoint) {
        match page(t, ep, timeout, bearer).await {
            Ok(text) => match serde_json::from_str::<Value>(&text) {
                // an answer without the field is a fact: the server has run no speculative step
                Ok(v) => stats = proof::read_accept_length(spec, &v),
                Err(_) => spec_note = Some(format!("{ep} did not answer JSON")),
            },
            Err(e) => spec_note = Some(e),
        }
    }
    let note = format!("{tokens} tokens in {ms} ms");
    Generation { ok: true, endpoint, tokens, ms, note, spec: stats, spec_note }
}

/// The text of a GET on the server (a metrics page, a server-info endpoint); `Err` says why not.
async fn page(t: &Target, path: &str, timeout: Duration, bearer: Option<&str>) -> Result<String, String> {
    match probe::request(t, "GET", path, None, timeout, bearer).await {
        Ok((200, b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Ok((code, _)) => Err(format!("{path} answered HTTP {code}")),
        Err(e) => Err(format!("{path}: {e}")),
    }
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
}
