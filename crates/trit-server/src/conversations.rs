//! OpenAI's Conversations API: a conversation is a list of items (messages, function calls and
//! their outputs, reasoning) kept by the server; `POST /v1/responses` with `conversation`
//! reads it as the turn's history and appends the turn's input and output items to it.
//! `POST /v1/conversations` (optional first `items` and `metadata`), `GET`/`POST`/`DELETE
//! /v1/conversations/{id}` (read, update metadata, delete), `GET`/`POST
//! /v1/conversations/{id}/items` (list a page, add items), `GET`/`DELETE
//! /v1/conversations/{id}/items/{item_id}`. Kept in memory like stored responses, within
//! [`MAX_CONVERSATIONS`] and [`MAX_BYTES`] (least recently used first).

use crate::bounded_map::{BoundedMap, Weighed};
use crate::error::ApiError;
use crate::request::decode;
use crate::response_store::{items_page, json_bytes, page, reply_messages, ItemsQuery};
use crate::responses::{input_items, input_messages};
use crate::state::AppState;
use crate::stream::{new_id, unix_now};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Conversations kept at most.
pub const MAX_CONVERSATIONS: usize = 1024;
/// Bytes kept at most (their items' JSON).
pub const MAX_BYTES: usize = 64 << 20;
/// Items one request may add (OpenAI's limit for creating a conversation or adding items).
const MAX_ADDED: usize = 20;

/// One conversation: its object's fields and its items, oldest first.
#[derive(Clone)]
pub struct Conversation {
    id: String,
    created_at: u64,
    metadata: Map<String, Value>,
    items: Vec<Value>,
}

impl Weighed for Conversation {
    fn bytes(&self) -> usize {
        json_bytes(&self.items) + Value::Object(self.metadata.clone()).to_string().len()
    }
}

impl Conversation {
    fn json(&self) -> Value {
        json!({"id": self.id, "object": "conversation", "created_at": self.created_at,
               "metadata": self.metadata})
    }
}

/// The server's conversations.
pub struct ConversationStore {
    map: BoundedMap<Conversation>,
}

impl Default for ConversationStore {
    fn default() -> Self {
        ConversationStore {
            map: BoundedMap::new(MAX_CONVERSATIONS, MAX_BYTES),
        }
    }
}

impl ConversationStore {
    /// The conversation's history as chat messages, for a response that continues it.
    pub fn messages(&self, id: &str) -> Result<Vec<Value>, ApiError> {
        let c = self.map.get(id).ok_or_else(|| not_found(id))?;
        items_messages(&c.items)
    }

    /// Appends a finished turn's items (its input, then its output) to conversation `id`; Err
    /// when the conversation is gone or would outgrow the store.
    pub fn append(&self, id: &str, items: Vec<Value>) -> Result<(), ApiError> {
        match self.map.update(id, |c| c.items.extend(items)) {
            Some(Ok(())) => Ok(()),
            Some(Err(_)) => Err(too_large(id)),
            None => Err(not_found(id)),
        }
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!(
        "no conversation '{id}' (never created, deleted, or dropped for room; this server keeps \
         at most {MAX_CONVERSATIONS} in memory)"
    ))
}

fn too_large(id: &str) -> ApiError {
    ApiError::invalid(format!(
        "conversation '{id}' outgrew this server's store ({MAX_BYTES} bytes) and was removed"
    ))
}

/// A conversation's items as the chat messages of its history: each run of the assistant's
/// output (its message and function calls) is one assistant message, as `previous_response_id`
/// rebuilds a turn; reasoning is left out (chat templates drop earlier turns' thinking); other
/// items are what a response's input makes of them.
pub fn items_messages(items: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    let mut run: Vec<Value> = Vec::new();
    for item in items {
        let assistant = item["type"] == "function_call"
            || (item["role"] == "assistant" && item["type"] != "function_call_output");
        if item["type"] == "reasoning" {
            continue;
        }
        if assistant {
            run.push(item.clone());
            continue;
        }
        if !run.is_empty() {
            messages.extend(reply_messages(&std::mem::take(&mut run)));
        }
        messages.extend(input_messages(&Value::Array(vec![item.clone()]))?);
    }
    if !run.is_empty() {
        messages.extend(reply_messages(&run));
    }
    Ok(messages)
}

/// Items a request adds: each one a response's input could hold (checked the same way), or a
/// reasoning item; given a type and an id where they have none.
fn new_items(items: Option<Value>) -> Result<Vec<Value>, ApiError> {
    let items = match items {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(v)) => v,
        Some(_) => return Err(ApiError::invalid("items must be a list of items")),
    };
    if items.len() > MAX_ADDED {
        return Err(ApiError::invalid(format!(
            "at most {MAX_ADDED} items can be added at once (got {})",
            items.len()
        )));
    }
    let checked: Vec<Value> = items
        .iter()
        .filter(|i| i["type"] != "reasoning")
        .cloned()
        .collect();
    if !checked.is_empty() {
        input_messages(&Value::Array(checked))?;
    }
    Ok(input_items(&Value::Array(items)))
}

#[derive(Deserialize)]
struct CreateRequest {
    items: Option<Value>,
    metadata: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct UpdateRequest {
    metadata: Map<String, Value>,
}

#[derive(Deserialize)]
struct ItemsRequest {
    items: Value,
}

/// `POST /v1/conversations`.
pub async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let made = (|| {
        // No body at all is an empty conversation (the SDKs send none without arguments).
        let empty = body.iter().all(u8::is_ascii_whitespace);
        let r: CreateRequest = decode(if empty { b"{}" } else { &body })?;
        let c = Conversation {
            id: new_id("conv_"),
            created_at: unix_now(),
            metadata: r.metadata.unwrap_or_default(),
            items: new_items(r.items)?,
        };
        if c.bytes() > MAX_BYTES {
            return Err(ApiError::invalid(format!(
                "the items are larger than this server's conversation store ({MAX_BYTES} bytes)"
            )));
        }
        let out = c.json();
        state.conversations.map.put(c.id.clone(), c);
        Ok(out)
    })();
    respond(made)
}

/// `GET /v1/conversations/{id}`.
pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    respond(
        state
            .conversations
            .map
            .get(&id)
            .map(|c| c.json())
            .ok_or_else(|| not_found(&id)),
    )
}

/// `POST /v1/conversations/{id}`: replaces its metadata.
pub async fn update(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let done = decode::<UpdateRequest>(&body).and_then(|r| {
        let update = state.conversations.map.update(&id, |c| {
            c.metadata = r.metadata;
            c.json()
        });
        match update {
            Some(Ok(v)) => Ok(v),
            Some(Err(_)) => Err(too_large(&id)),
            None => Err(not_found(&id)),
        }
    });
    respond(done)
}

/// `DELETE /v1/conversations/{id}`.
pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    respond(if state.conversations.map.remove(&id) {
        Ok(json!({"id": id, "object": "conversation.deleted", "deleted": true}))
    } else {
        Err(not_found(&id))
    })
}

/// `GET /v1/conversations/{id}/items`: a page of its items (newest first unless `order=asc`).
pub async fn list_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<ItemsQuery>,
) -> Response {
    let listed = items_page(&q).and_then(|(asc, limit)| {
        let c = state
            .conversations
            .map
            .get(&id)
            .ok_or_else(|| not_found(&id))?;
        Ok(page(&c.items, asc, limit, q.after.as_deref()))
    });
    respond(listed)
}

/// `POST /v1/conversations/{id}/items`: adds items at its end; the list of those added.
pub async fn add_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let added = decode::<ItemsRequest>(&body).and_then(|r| {
        let items = new_items(Some(r.items))?;
        state.conversations.append(&id, items.clone())?;
        Ok(page(&items, true, items.len().max(1), None))
    });
    respond(added)
}

/// `GET /v1/conversations/{id}/items/{item_id}`.
pub async fn get_item(
    State(state): State<Arc<AppState>>,
    Path((id, item_id)): Path<(String, String)>,
) -> Response {
    let found = state
        .conversations
        .map
        .get(&id)
        .ok_or_else(|| not_found(&id))
        .and_then(|c| {
            c.items
                .iter()
                .find(|i| i["id"] == item_id.as_str())
                .cloned()
                .ok_or_else(|| no_item(&id, &item_id))
        });
    respond(found)
}

/// `DELETE /v1/conversations/{id}/items/{item_id}`: the conversation without it.
pub async fn delete_item(
    State(state): State<Arc<AppState>>,
    Path((id, item_id)): Path<(String, String)>,
) -> Response {
    let removed = state.conversations.map.update(&id, |c| {
        let before = c.items.len();
        c.items.retain(|i| i["id"] != item_id.as_str());
        (c.items.len() < before).then(|| c.json())
    });
    respond(match removed {
        Some(Ok(Some(v))) => Ok(v),
        Some(Ok(None)) => Err(no_item(&id, &item_id)),
        Some(Err(_)) => Err(too_large(&id)),
        None => Err(not_found(&id)),
    })
}

fn no_item(id: &str, item_id: &str) -> ApiError {
    ApiError::not_found(format!("conversation '{id}' has no item '{item_id}'"))
}

fn respond(r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_the_messages_a_chained_response_would_give() {
        let items = [
            json!({"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                    "text": "Weather?"}]}),
            json!({"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]}),
            json!({"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": "Let me look."}]}),
            json!({"type": "function_call", "call_id": "call_1", "name": "weather",
                   "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "call_1", "output": "sunny"}),
            json!({"role": "assistant", "content": "Sunny."}),
        ];
        let m = items_messages(&items).unwrap();
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(m[0], json!({"role": "user", "content": "Weather?"}));
        // The assistant's text and call are one message, as reply_messages makes a turn's.
        assert_eq!(m[1]["content"], "Let me look.");
        assert_eq!(m[1]["tool_calls"][0]["id"], "call_1");
        assert_eq!(m[2]["role"], "tool");
        assert_eq!(m[3], json!({"role": "assistant", "content": "Sunny."}));
    }

    #[test]
    fn added_items_are_checked_typed_and_given_ids() {
        let items = new_items(Some(json!([{"role": "user", "content": "hi"}]))).unwrap();
        assert_eq!(items[0]["type"], "message");
        assert!(items[0]["id"].as_str().unwrap().starts_with("msg_"));
        assert!(new_items(Some(json!([{"type": "image", "url": "x"}]))).is_err());
        assert!(new_items(Some(json!({"role": "user"}))).is_err());
        let many: Vec<Value> = (0..21)
            .map(|_| json!({"role": "user", "content": "x"}))
            .collect();
        assert!(new_items(Some(Value::Array(many))).is_err());
        assert!(new_items(None).unwrap().is_empty());
    }

    #[test]
    fn appending_to_a_missing_conversation_is_refused() {
        let store = ConversationStore::default();
        assert!(store.append("conv_x", vec![json!({})]).is_err());
        assert!(store.messages("conv_x").is_err());
    }
}
