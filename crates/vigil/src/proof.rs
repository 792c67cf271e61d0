//! Proof of readiness: one real completion through the server's own API, and, when the command asks
//! for speculative decoding, proof that it is on (or a `degraded: speculation off` verdict).

use crate::probe::{self, Target};
use serde_json::Value;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, serde::Serialize)]
pub struct GenProof {
    pub ok: bool,
    pub endpoint: String,
    pub tokens: u64,
    pub ms: u64,
    pub note: String,
    /// (drafted, accepted) when the server reports it.
    pub spec: Option<(u64, u64)>,
}

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

/// Sends one small greedy completion and checks that the answer has tokens.
pub async fn generate(kind: Option<&str>, t: &Target, timeout: Duration, bearer: Option<&str>) -> GenProof {
    generate_with(kind, t, timeout, bearer, None, proof_tokens(false)).await
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

pub async fn generate_with(
    kind: Option<&str>,
    t: &Target,
    timeout: Duration,
    bearer: Option<&str>,
    hint: Option<String>,
    tokens: u32,
) -> GenProof {
    let t0 = Instant::now();
    let fail = |endpoint: &str, note: String| GenProof {
        ok: false,
        endpoint: endpoint.into(),
        tokens: 0,
        ms: t0.elapsed().as_millis() as u64,
        note,
        spec: None,
    };
    let (endpoint, body) = match kind {
        Some("llama-cpp") => (
            "/completion".to_string(),
            serde_json::json!({"prompt": "Hello, my name is", "n_predict": tokens, "temperature": 0, "top_k": 1, "cache_prompt": false}),
        ),
        Some("sglang") => (
            "/generate".to_string(),
            serde_json::json!({"text": "The capital city of France is", "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}),
        ),
        _ => {
            // OpenAI-compatible servers need the model id first.
            let model = match probe::request(t, "GET", "/v1/models", None, timeout, bearer).await {
                Ok((200, b)) => {
                    serde_json::from_slice::<Value>(&b).ok().and_then(|v| v["data"][0]["id"].as_str().map(String::from))
                }
                _ => None,
            };
            let Some(model) = model.or(hint) else { return fail("/v1/models", "no model id from /v1/models".into()) };
            (
                "/v1/completions".to_string(),
                serde_json::json!({"model": model, "prompt": "Hello, my name is", "max_tokens": tokens, "temperature": 0}),
            )
        }
    };
    let (code, b) = match probe::request(t, "POST", &endpoint, Some(&body.to_string()), timeout, bearer).await {
        Ok(x) => x,
        Err(e) => return fail(&endpoint, e),
    };
    let ms = t0.elapsed().as_millis() as u64;
    if code != 200 {
        let snippet: String = String::from_utf8_lossy(&b).chars().take(200).collect();
        return GenProof { ok: false, endpoint, tokens: 0, ms, note: format!("HTTP {code}: {snippet}"), spec: None };
    }
    let Ok(v) = serde_json::from_slice::<Value>(&b) else {
        return GenProof { ok: false, endpoint, tokens: 0, ms, note: "answer is not JSON".into(), spec: None };
    };
    let (tokens, text_len, spec) = match kind {
        Some("llama-cpp") => {
            let tm = &v["timings"];
            let spec = num(&tm["draft_n"]).map(|d| (d, num(&tm["draft_n_accepted"]).unwrap_or(0)));
            (
                num(&v["tokens_predicted"]).or(num(&tm["predicted_n"])).unwrap_or(0),
                v["content"].as_str().map_or(0, |s| s.len()),
                spec,
            )
        }
        Some("sglang") => {
            (num(&v["meta_info"]["completion_tokens"]).unwrap_or(0), v["text"].as_str().map_or(0, |s| s.len()), None)
        }
        _ => (
            num(&v["usage"]["completion_tokens"]).unwrap_or(0),
            v["choices"][0]["text"].as_str().map_or(0, |s| s.len()),
            None,
        ),
    };
    let tokens = if tokens == 0 && text_len > 0 { 1 } else { tokens };
    if tokens == 0 {
        return GenProof { ok: false, endpoint, tokens: 0, ms, note: "the answer has no tokens".into(), spec };
    }
    GenProof { ok: true, endpoint, tokens, ms, note: format!("{tokens} tokens in {ms} ms"), spec }
}

/// SGLang: `/server_info` → `internal_states[0].avg_spec_accept_length` (older: top level).
pub async fn sglang_accept_length(t: &Target, timeout: Duration, bearer: Option<&str>) -> Option<f64> {
    let (code, b) = probe::request(t, "GET", "/server_info", None, timeout, bearer).await.ok()?;
    if code != 200 {
        return None;
    }
    let v: Value = serde_json::from_slice(&b).ok()?;
    v["internal_states"][0]["avg_spec_accept_length"].as_f64().or_else(|| v["avg_spec_accept_length"].as_f64())
}
