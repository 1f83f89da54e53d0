//! Stored responses of `POST /v1/responses` (OpenAI's default `store: true`): a later request
//! continues a conversation with `previous_response_id` instead of resending it, and
//! `GET` / `DELETE /v1/responses/{id}` read and remove one. Each entry keeps its response object
//! and the chat messages it added — its input messages and its reply — linked to the response
//! before it; a conversation is rebuilt by walking the links, so a long chain costs memory
//! once per turn, not once per turn per turn. The KV prefix cache then finds most of the
//! rebuilt prompt already computed.
//!
//! Memory only (like llama.cpp's slots, nothing survives a restart), bounded by
//! [`MAX_RESPONSES`] and [`MAX_BYTES`]: the least recently used entries go first, and a chain
//! whose older link went is refused by name rather than continued without it.

use crate::bounded_map::{BoundedMap, Weighed};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

/// Responses kept at most.
pub const MAX_RESPONSES: usize = 1024;
/// Bytes kept at most (their JSON's length).
pub const MAX_BYTES: usize = 64 << 20;
/// Links followed at most when rebuilding a conversation.
const MAX_CHAIN: usize = 10_000;

/// One stored response.
#[derive(Clone)]
pub struct Stored {
    /// The response object as it was returned.
    pub response: Value,
    /// The response this one continued.
    pub previous: Option<String>,
    /// The chat messages this turn added: its input, then its reply.
    pub messages: Vec<Value>,
    /// Its input as the API's items, in request order.
    pub input_items: Vec<Value>,
    bytes: usize,
}

impl Stored {
    pub fn new(
        response: Value,
        previous: Option<String>,
        messages: Vec<Value>,
        input_items: Vec<Value>,
    ) -> Stored {
        let bytes = response.to_string().len() + json_bytes(&messages) + json_bytes(&input_items);
        Stored {
            response,
            previous,
            messages,
            input_items,
            bytes,
        }
    }
}

impl Weighed for Stored {
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The length of `values` as JSON (what an entry weighs against a store's byte bound).
pub fn json_bytes(values: &[Value]) -> usize {
    values.iter().map(|m| m.to_string().len()).sum()
}

/// The server's stored responses.
pub struct ResponseStore {
    map: BoundedMap<Stored>,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(MAX_RESPONSES, MAX_BYTES)
    }
}

impl ResponseStore {
    pub fn new(max_responses: usize, max_bytes: usize) -> ResponseStore {
        ResponseStore {
            map: BoundedMap::new(max_responses, max_bytes),
        }
    }

    /// Keeps `stored` under `id`, dropping the least recently used entries beyond the bounds
    /// (one larger than the byte bound alone is not kept).
    pub fn put(&self, id: String, stored: Stored) {
        self.map.put(id, stored)
    }

    /// The response `id` (marked as used).
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.map.get(id)
    }

    pub fn delete(&self, id: &str) -> bool {
        self.map.remove(id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The chat messages of the conversation that ends with response `id`, oldest first; each
    /// link is marked as used. Err names the link that is missing (never stored, deleted, or
    /// dropped for room).
    pub fn conversation(&self, id: &str) -> Result<Vec<Value>, ApiError> {
        let mut turns = Vec::new();
        let mut at = Some(id.to_string());
        while let Some(id) = at {
            if turns.len() >= MAX_CHAIN {
                return Err(ApiError::invalid(format!(
                    "previous_response_id: the conversation is longer than {MAX_CHAIN} responses"
                )));
            }
            let s = self
                .get(&id)
                .ok_or_else(|| missing(&id, turns.is_empty()))?;
            at = s.previous.clone();
            turns.push(s);
        }
        Ok(turns
            .iter()
            .rev()
            .flat_map(|s| s.messages.iter().cloned())
            .collect())
    }
}

fn missing(id: &str, asked: bool) -> ApiError {
    if asked {
        ApiError::not_found(format!(
            "previous_response_id: no stored response '{id}' (never stored, deleted, or dropped \
             for room; this server keeps at most {MAX_RESPONSES} in memory)"
        ))
    } else {
        ApiError::not_found(format!(
            "previous_response_id: an earlier response of this conversation, '{id}', is no \
             longer stored (deleted, or dropped for room); send the conversation as input items"
        ))
    }
}

/// A response's output items as the chat messages that continue its conversation: the
/// message's text and the function calls as one assistant message (reasoning is left out,
/// as the chat templates leave earlier turns' thinking out).
pub fn reply_messages(output: &[Value]) -> Vec<Value> {
    let mut content = String::new();
    let mut calls = Vec::new();
    for item in output {
        match item["type"].as_str() {
            Some("message") | None => match &item["content"] {
                Value::String(s) => content.push_str(s),
                parts => {
                    for part in parts.as_array().into_iter().flatten() {
                        content.push_str(part["text"].as_str().unwrap_or(""));
                    }
                }
            },
            Some("function_call") => calls.push(json!({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })),
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
        if content.is_empty() {
            message["content"] = Value::Null;
        }
    }
    vec![message]
}

/// `GET /v1/responses/{id}`.
pub async fn get_response(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(s) => axum::Json(s.response.clone()).into_response(),
        None => ApiError::not_found(format!("no stored response '{id}'")).into_response(),
    }
}

/// The query of `GET /v1/responses/{id}/input_items` and of a conversation's items (OpenAI's:
/// newest first unless `order=asc`, 20 items unless `limit` says 1–100, from after `after`).
#[derive(serde::Deserialize)]
pub struct ItemsQuery {
    order: Option<String>,
    limit: Option<usize>,
    pub after: Option<String>,
}

/// `GET /v1/responses/{id}/input_items`: the response's input items, a page at a time.
pub async fn input_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<ItemsQuery>,
) -> Response {
    match (state.responses.get(&id), items_page(&q)) {
        (Some(s), Ok((asc, limit))) => {
            axum::Json(page(&s.input_items, asc, limit, q.after.as_deref())).into_response()
        }
        (None, _) => ApiError::not_found(format!("no stored response '{id}'")).into_response(),
        (_, Err(e)) => e.into_response(),
    }
}

pub fn items_page(q: &ItemsQuery) -> Result<(bool, usize), ApiError> {
    let asc = match q.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(o) => {
            return Err(ApiError::invalid(format!(
                "order must be asc or desc, not {o:?}"
            )))
        }
    };
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 100"));
    }
    Ok((asc, limit))
}

/// A list page of `items` (request order) in the asked order, starting after item `after`.
pub fn page(items: &[Value], asc: bool, limit: usize, after: Option<&str>) -> Value {
    let ordered: Vec<&Value> = if asc {
        items.iter().collect()
    } else {
        items.iter().rev().collect()
    };
    let start = after
        .and_then(|a| ordered.iter().position(|i| i["id"] == a))
        .map_or(0, |i| i + 1);
    let data: Vec<Value> = ordered[start..]
        .iter()
        .take(limit)
        .map(|v| (*v).clone())
        .collect();
    json!({
        "object": "list",
        "first_id": data.first().map(|i| i["id"].clone()),
        "last_id": data.last().map(|i| i["id"].clone()),
        "has_more": start + data.len() < ordered.len(),
        "data": data,
    })
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    if state.responses.delete(&id) {
        axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        ApiError::not_found(format!("no stored response '{id}'")).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(previous: Option<&str>, text: &str) -> Stored {
        Stored::new(
            json!({"id": text}),
            previous.map(str::to_string),
            vec![json!({"role": "user", "content": text})],
            Vec::new(),
        )
    }

    #[test]
    fn conversations_follow_the_links_oldest_first() {
        let store = ResponseStore::default();
        store.put("a".into(), turn(None, "one"));
        store.put("b".into(), turn(Some("a"), "two"));
        store.put("c".into(), turn(Some("b"), "three"));
        let texts: Vec<String> = store
            .conversation("c")
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(texts, ["one", "two", "three"]);
        assert_eq!(store.conversation("b").unwrap().len(), 2);
        // A missing start, and a missing older link, are refused by name.
        let e = store.conversation("zz").unwrap_err().body().to_string();
        assert!(e.contains("'zz'"), "{e}");
        assert!(store.delete("a"));
        assert!(!store.delete("a"));
        let e = store.conversation("c").unwrap_err().body().to_string();
        assert!(e.contains("'a'") && e.contains("earlier"), "{e}");
    }

    #[test]
    fn the_least_recently_used_go_first_within_both_bounds() {
        let store = ResponseStore::new(2, MAX_BYTES);
        store.put("a".into(), turn(None, "one"));
        store.put("b".into(), turn(None, "two"));
        assert!(store.get("a").is_some()); // a is now newer than b
        store.put("c".into(), turn(None, "three"));
        assert!(store.get("b").is_none());
        assert!(store.get("a").is_some() && store.get("c").is_some());
        assert_eq!(store.len(), 2);

        let one = turn(None, "x").bytes;
        let store = ResponseStore::new(100, 2 * one);
        for id in ["p", "q", "r"] {
            store.put(id.into(), turn(None, "x"));
        }
        assert_eq!(store.len(), 2);
        assert!(store.get("p").is_none());
        // An entry larger than the whole bound is not kept (and evicts nothing).
        store.put("big".into(), turn(None, &"y".repeat(4 * one)));
        assert!(store.get("big").is_none());
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn input_items_page_newest_first_or_in_order_after_an_id() {
        let items: Vec<Value> = ["a", "b", "c"].iter().map(|i| json!({"id": i})).collect();
        let ids = |v: &Value| -> Vec<String> {
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_string())
                .collect()
        };
        let p = page(&items, false, 20, None);
        assert_eq!(ids(&p), ["c", "b", "a"]);
        assert_eq!(
            (p["first_id"].clone(), p["has_more"].clone()),
            (json!("c"), json!(false))
        );
        let p = page(&items, true, 2, None);
        assert_eq!(ids(&p), ["a", "b"]);
        assert_eq!(
            (p["last_id"].clone(), p["has_more"].clone()),
            (json!("b"), json!(true))
        );
        let p = page(&items, true, 2, Some("b"));
        assert_eq!(ids(&p), ["c"]);
        assert_eq!(p["has_more"], false);
        assert_eq!(ids(&page(&items, false, 5, Some("b"))), ["a"]);
        let bad = ItemsQuery {
            order: Some("up".into()),
            limit: None,
            after: None,
        };
        assert!(items_page(&bad).is_err());
        let bad = ItemsQuery {
            order: None,
            limit: Some(0),
            after: None,
        };
        assert!(items_page(&bad).is_err());
    }

    #[test]
    fn replies_become_one_assistant_message_without_the_reasoning() {
        let output = [
            json!({"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]}),
            json!({"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}),
        ];
        assert_eq!(
            reply_messages(&output),
            [json!({"role": "assistant", "content": "Hi"})]
        );
        let output = [
            json!({"type": "function_call", "call_id": "call_1", "name": "f",
                             "arguments": "{}"}),
        ];
        let m = &reply_messages(&output)[0];
        assert_eq!(m["content"], Value::Null);
        assert_eq!(m["tool_calls"][0]["id"], "call_1");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "f");
    }
}
