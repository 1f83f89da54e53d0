//! A JSON Schema compiled into the flat node table the recognizer walks. The subset is what
//! structured-output clients send (OpenAI's `json_schema`, pydantic's `model_json_schema()`):
//! `type` (one or several), `properties`, `required`, `additionalProperties`, `items`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum` (and exclusive forms),
//! `multipleOf`, `enum`, `const`, `anyOf`/`oneOf` (branches of different JSON types merged,
//! others read along every branch: `recognizer/forks.rs`), `$ref` into
//! `$defs`/`definitions` (recursion included), `allOf` (one schema beside annotations, or
//! several merged into one: `schema/all_of.rs`), `not` around a `type`.
//! Annotations (`title`, `description`, `default`, `format`, …) are ignored, as validators
//! ignore them.
//! Any other keyword is refused with its name: a schema is enforced or rejected, never
//! enforced in part.

use super::dec_range::DecRange;
use super::int_range::IntRange;
use super::pattern::{format_regex, Pattern};
use crate::{Error, Result};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::HashMap;

mod all_of;
mod literals;
mod negation;
mod union;

use literals::{literal_form, literal_kind, literals};

/// Value kinds a node admits (bit flags).
pub(crate) const NULL: u8 = 1;
pub(crate) const BOOL: u8 = 2;
pub(crate) const INTEGER: u8 = 4;
/// Any number, integers included.
pub(crate) const NUMBER: u8 = 8;
pub(crate) const STRING: u8 = 16;
pub(crate) const OBJECT: u8 = 32;
pub(crate) const ARRAY: u8 = 64;
const ALL: u8 = NULL | BOOL | INTEGER | NUMBER | STRING | OBJECT | ARRAY;

/// The node of any JSON value (index 0 of every table).
pub(crate) const ANY: usize = 0;

/// At most this many properties per object and values per `enum`: the recognizer tracks
/// them in one 64-bit mask.
pub(crate) const MAX_ALTERNATIVES: usize = 64;

#[derive(Clone, Debug)]
pub(crate) struct ObjectSpec {
    /// Property names as they appear between the quotes (JSON-escaped), and their value nodes.
    pub(crate) props: Vec<(Vec<u8>, usize)>,
    /// Bit i: property i is required.
    pub(crate) required: u64,
    /// The node of any other property's value; `None`: no other properties.
    pub(crate) additional: Option<usize>,
}

#[derive(Clone, Debug)]
pub(crate) struct ArraySpec {
    /// `prefixItems`: the nodes of the first items, in order (tuples).
    pub(crate) prefix: Vec<usize>,
    /// The node of every later item.
    pub(crate) items: usize,
    pub(crate) min: usize,
    pub(crate) max: Option<usize>,
}

impl ArraySpec {
    /// The node of item `i`.
    pub(crate) fn item(&self, i: usize) -> usize {
        self.prefix.get(i).copied().unwrap_or(self.items)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) kinds: u8,
    /// `enum`/`const`: the value must be one of these compact serializations, byte for byte.
    pub(crate) literals: Option<Vec<Vec<u8>>>,
    pub(crate) object: ObjectSpec,
    pub(crate) array: ArraySpec,
    /// Characters (code points) a string value may have.
    pub(crate) min_len: usize,
    pub(crate) max_len: Option<usize>,
    /// A string's `pattern` (or enforced `format`): index into `JsonSchema::patterns`.
    pub(crate) pattern: Option<usize>,
    /// An integer's `minimum`/`maximum` (and exclusive forms) and `multipleOf`.
    pub(crate) int_range: Option<IntRange>,
    /// A number's (type `number`: the text may have a fraction).
    pub(crate) dec_range: Option<DecRange>,
    /// An `anyOf`/`oneOf` whose branches a value's first byte cannot tell apart: the value is
    /// read along each of these nodes at once (`recognizer/forks.rs`); the fields above then
    /// only summarize (`kinds`: the union of the branches').
    pub(crate) branches: Vec<usize>,
}

impl Node {
    fn any() -> Node {
        Node {
            kinds: ALL,
            literals: None,
            object: ObjectSpec {
                props: Vec::new(),
                required: 0,
                additional: Some(ANY),
            },
            array: ArraySpec {
                prefix: Vec::new(),
                items: ANY,
                min: 0,
                max: None,
            },
            min_len: 0,
            max_len: None,
            pattern: None,
            int_range: None,
            dec_range: None,
            branches: Vec::new(),
        }
    }
}

/// A compiled schema: `nodes[ANY]` is any value, `nodes[root]` the document's.
#[derive(Clone, Debug)]
pub struct JsonSchema {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: usize,
    pub(crate) patterns: Vec<Pattern>,
    /// A forced tool call: the document is one of these literal openings (each naming its
    /// tool), then that tool's arguments (the node), then `closing`.
    pub(crate) openings: Vec<(Vec<u8>, usize)>,
    pub(crate) closing: Vec<u8>,
    /// The arguments are written in Qwen3.5's XML dialect (`JsonSchema::xml_tool_call`), not
    /// as a JSON object.
    pub(crate) xml: bool,
    /// Some node has `branches` (the recognizer then keeps copies to fork from).
    pub(crate) has_forks: bool,
}

/// A name the XML dialect can write between `=` and `>` as it is (its JSON escape is itself).
fn plain_xml_name(b: &[u8]) -> bool {
    !b.is_empty()
        && !b
            .iter()
            .any(|&c| c < 0x20 || matches!(c, b'<' | b'>' | b'"' | b'\\'))
}

/// Keywords that do not constrain a value.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "format",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    "strict",
    "discriminator",
    "nullable",
];

impl JsonSchema {
    /// Any JSON object (OpenAI's `json_object` mode).
    pub fn any_object() -> JsonSchema {
        let mut obj = Node::any();
        obj.kinds = OBJECT;
        JsonSchema {
            nodes: vec![Node::any(), obj],
            root: 1,
            patterns: Vec::new(),
            openings: Vec::new(),
            closing: Vec::new(),
            xml: false,
            has_forks: false,
        }
    }

    /// One call of one of `tools` (name, parameters schema) in the Qwen3/Hermes dialect:
    /// `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`, ARGS a document of
    /// that tool's parameters schema.
    pub fn tool_call(tools: &[(String, Value)]) -> Result<JsonSchema> {
        let (nodes, patterns, openings) = Self::tools(tools, |name| {
            let quoted = serde_json::to_string(name).expect("strings serialize");
            format!("<tool_call>\n{{\"name\": {quoted}, \"arguments\": ")
        })?;
        Ok(JsonSchema {
            has_forks: forks(&nodes),
            nodes,
            root: ANY,
            patterns,
            openings,
            closing: b"}\n</tool_call>".to_vec(),
            xml: false,
        })
    }

    /// One call of one of `tools` in Qwen3.5's XML dialect: `<tool_call>\n<function=NAME>\n`,
    /// per argument `<parameter=ARG>\nVALUE\n</parameter>\n` (VALUE JSON), then
    /// `</function>\n</tool_call>`. Each tool's parameters must be an object schema whose
    /// property names are plain text (no `<`, `>`, quotes, backslashes or control characters);
    /// only its declared properties are written.
    pub fn xml_tool_call(tools: &[(String, Value)]) -> Result<JsonSchema> {
        for (name, _) in tools {
            if !plain_xml_name(name.as_bytes()) {
                return Err(Error::InvalidArgument(format!(
                    "tool name {name:?}: the XML tool-call dialect needs names without <, >, \
                     quotes, backslashes or control characters"
                )));
            }
        }
        let (nodes, patterns, openings) =
            Self::tools(tools, |name| format!("<tool_call>\n<function={name}>\n"))?;
        for ((name, _), (_, node)) in tools.iter().zip(&openings) {
            let n = &nodes[*node];
            if n.kinds & OBJECT == 0 || n.literals.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "tool {name:?}: the XML tool-call dialect needs parameters that are an \
                     object schema"
                )));
            }
            if let Some((p, _)) = n.object.props.iter().find(|(p, _)| !plain_xml_name(p)) {
                return Err(Error::InvalidArgument(format!(
                    "tool {name:?}: parameter {:?} cannot be named in the XML tool-call dialect \
                     (no <, >, quotes, backslashes or control characters)",
                    String::from_utf8_lossy(p)
                )));
            }
        }
        Ok(JsonSchema {
            has_forks: forks(&nodes),
            nodes,
            root: ANY,
            patterns,
            openings,
            closing: b"</function>\n</tool_call>".to_vec(),
            xml: true,
        })
    }

    /// Compiles each tool's parameters schema into one node table; each tool's opening text
    /// (from `open(name)`) with its parameters' node.
    #[allow(clippy::type_complexity)]
    fn tools(
        tools: &[(String, Value)],
        open: impl Fn(&str) -> String,
    ) -> Result<(Vec<Node>, Vec<Pattern>, Vec<(Vec<u8>, usize)>)> {
        if tools.is_empty() || tools.len() > MAX_ALTERNATIVES {
            return Err(Error::InvalidArgument(format!(
                "a forced tool call needs 1 to {MAX_ALTERNATIVES} tools"
            )));
        }
        let mut openings = Vec::new();
        let mut nodes = vec![Node::any()];
        let mut patterns = Vec::new();
        for (name, params) in tools {
            let mut c = Compiler {
                root: params,
                nodes,
                patterns,
                refs: HashMap::new(),
                building: Vec::new(),
            };
            let node = c.node(params, &format!("tool {name:?} parameters"))?;
            nodes = c.nodes;
            patterns = c.patterns;
            openings.push((open(name).into_bytes(), node));
        }
        Ok((nodes, patterns, openings))
    }

    /// Compiles `schema`; an error names the first keyword or construct it cannot enforce.
    pub fn compile(schema: &Value) -> Result<JsonSchema> {
        let mut c = Compiler {
            root: schema,
            nodes: vec![Node::any()],
            patterns: Vec::new(),
            refs: HashMap::new(),
            building: Vec::new(),
        };
        let root = c.node(schema, "#")?;
        Ok(JsonSchema {
            has_forks: forks(&c.nodes),
            nodes: c.nodes,
            root,
            patterns: c.patterns,
            openings: Vec::new(),
            closing: Vec::new(),
            xml: false,
        })
    }
}

struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    patterns: Vec<Pattern>,
    /// `$ref` targets compiled so far (recursive references reuse the reserved index).
    refs: HashMap<String, usize>,
    /// Reserved indices whose node is still being built.
    building: Vec<usize>,
}

/// The schema an `allOf` stands for; `None` without `allOf`. One schema beside annotations
/// only (pydantic wraps a described field of a model type so: `{"allOf": [{"$ref": …}],
/// "description": …}`) is that schema itself (recursive references included); several, or
/// other keywords beside, are merged into one (`all_of.rs`) or refused.
fn all_of<'a>(root: &Value, o: &'a Map<String, Value>, at: &str) -> Result<Option<Cow<'a, Value>>> {
    let Some(all) = o.get("allOf") else {
        return Ok(None);
    };
    // `format` may be enforced (a string's date, uuid, …): not a bare annotation here.
    match all.as_array().map(Vec::as_slice) {
        Some([one]) if only_annotations_beside(o, &["allOf"]) => Ok(Some(Cow::Borrowed(one))),
        _ => all_of::merge_all_of(root, o, at).map(|v| Some(Cow::Owned(v))),
    }
}

/// The schema `$ref` `r` points to (only references into this schema: `#` or `#/…`).
fn resolve<'a>(root: &'a Value, r: &str, at: &str) -> Result<&'a Value> {
    if r == "#" {
        return Ok(root);
    }
    let path = r.strip_prefix("#/").ok_or_else(|| {
        bad(
            at,
            format!("`$ref` {r:?}: only references into this schema (#/…) are supported"),
        )
    })?;
    let mut t = root;
    for part in path.split('/') {
        let part = part.replace("~1", "/").replace("~0", "~");
        t = t
            .get(&part)
            .ok_or_else(|| bad(at, format!("`$ref` {r:?} points nowhere")))?;
    }
    Ok(t)
}

/// Whether every key of `o` but `keys` is an annotation (`format` excepted: it may be
/// enforced).
fn only_annotations_beside(o: &Map<String, Value>, keys: &[&str]) -> bool {
    o.keys().all(|k| {
        let k = k.as_str();
        keys.contains(&k) || (k != "format" && ANNOTATIONS.contains(&k))
    })
}

/// Refuses `what` (numeric keywords) on a node that admits other kinds than numbers (and null).
fn numbers_only(node: &Node, at: &str, what: &str) -> Result<()> {
    if node.kinds & !(INTEGER | NUMBER | NULL) != 0 || node.kinds & (INTEGER | NUMBER) == 0 {
        return Err(bad(
            at,
            format!("{what} supported on numbers only (type \"integer\" or \"number\")"),
        ));
    }
    Ok(())
}

/// Where an `allOf` merge puts the patterns of members beside the first one's `pattern` (a key
/// no schema writer uses; the string must match them all).
pub(super) const MORE_PATTERNS: &str = "\u{1}trit:more patterns";

/// The kinds a `not` excludes: the form `{"not": {"type": …}}` ("not null", "not a string"),
/// whose complement is a set of types (`not` of values beside an `enum` is taken apart
/// elsewhere); any other `not` would need the complement of a schema: refused.
fn excluded_kinds(not: &Value, at: &str) -> Result<u8> {
    match not {
        Value::Object(o) if o.contains_key("type") && only_annotations_beside(o, &["type"]) => {
            let k = kinds_of(&o["type"], at)?;
            // "not integer" leaves the numbers with a fraction, which the recognizer cannot
            // tell from integers by kind alone.
            if k & INTEGER != 0 && k & NUMBER == 0 {
                return Err(bad(at, "`not` of `integer` alone is not supported"));
            }
            Ok(k)
        }
        _ => Err(bad(
            at,
            "`not` is supported only around a `type`, a string's `pattern` or `format`, string values, or values beside an `enum`/`const`",
        )),
    }
}

fn bad(at: &str, what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("json schema at {at}: {what}"))
}

/// Marks the errors of a schema that admits no value: an `anyOf`/`oneOf` branch that fails so
/// is dropped (the union admits what its other branches do); anywhere else it is refused.
const ADMITS_NOTHING: &str = "admits no value";

fn empty(at: &str, why: &str) -> Error {
    bad(at, format!("{ADMITS_NOTHING}: {why}"))
}

impl Compiler<'_> {
    /// Compiles `v` into a new node and returns its index.
    fn node(&mut self, v: &Value, at: &str) -> Result<usize> {
        let o = match v {
            Value::Bool(true) => return Ok(ANY),
            Value::Bool(false) => return Err(bad(at, "`false` admits no value")),
            Value::Object(o) => o,
            _ => return Err(bad(at, "a schema must be an object or a boolean")),
        };
        if let Some(one) = all_of(self.root, o, at)? {
            return self.node(&one, &format!("{at}/allOf"));
        }
        if let Some(r) = o.get("$ref") {
            if o.keys()
                .any(|k| k != "$ref" && !ANNOTATIONS.contains(&k.as_str()))
            {
                return Err(bad(at, "`$ref` beside other keywords is not supported"));
            }
            return self.reference(r, at);
        }
        let index = self.nodes.len();
        self.nodes.push(Node::any());
        let node = self.build(o, at)?;
        self.nodes[index] = node;
        Ok(index)
    }

    fn reference(&mut self, r: &Value, at: &str) -> Result<usize> {
        let r = r
            .as_str()
            .ok_or_else(|| bad(at, "`$ref` must be a string"))?;
        if let Some(&i) = self.refs.get(r) {
            return Ok(i);
        }
        let target = resolve(self.root, r, at)?;
        // Reserve the index first so that a recursive reference finds it.
        let index = self.nodes.len();
        self.nodes.push(Node::any());
        self.refs.insert(r.to_string(), index);
        let o = match target {
            Value::Bool(true) => return Ok(ANY),
            Value::Object(o) => o,
            _ => return Err(bad(r, "a referenced schema must be an object")),
        };
        self.building.push(index);
        let node = if let Some(inner) = o.get("$ref") {
            let i = self.reference(inner, r)?;
            self.nodes[i].clone()
        } else {
            self.build(o, r)?
        };
        self.building.retain(|&b| b != index);
        self.nodes[index] = node;
        Ok(index)
    }

    fn build(&mut self, o: &Map<String, Value>, at: &str) -> Result<Node> {
        if let Some(one) = all_of(self.root, o, at)? {
            // A referenced wrapper: a copy of the node it wraps, which must be complete.
            let i = self.node(&one, &format!("{at}/allOf"))?;
            if self.building.contains(&i) {
                return Err(bad(
                    at,
                    "an `allOf` around a recursive reference is not supported",
                ));
            }
            return Ok(self.nodes[i].clone());
        }
        const KNOWN: &[&str] = &[
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "minItems",
            "maxItems",
            "prefixItems",
            "minLength",
            "maxLength",
            "pattern",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
            "enum",
            "const",
            "anyOf",
            "oneOf",
            "not",
            MORE_PATTERNS,
        ];
        for k in o.keys() {
            if !KNOWN.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                return Err(bad(at, format!("the keyword `{k}` is not supported")));
            }
        }
        let mut node = Node::any();
        node.kinds = match o.get("type") {
            None => ALL,
            Some(t) => kinds_of(t, at)?,
        };
        // `not` of a type narrows the kinds here; `not` of values takes them from the literals
        // below.
        let not_values = match o.get("not") {
            Some(not) => literals::excluded_values(not, &format!("{at}/not"))?,
            None => None,
        };
        // Patterns a `not` of string keywords or string values excludes.
        let mut negated = Vec::new();
        if let (Some(not), None) = (o.get("not"), &not_values) {
            let at_not = format!("{at}/not");
            if let Some(ex) = negation::string_exclusion(not, &at_not)? {
                node.kinds &= if ex.strings_only { STRING } else { ALL };
                negated = ex.patterns;
            } else {
                node.kinds &= !excluded_kinds(not, &at_not)?;
            }
            if node.kinds == 0 {
                return Err(empty(at, "`not` excludes every type"));
            }
        }
        if let Some(alts) = o.get("anyOf").or_else(|| o.get("oneOf")) {
            if o.contains_key("anyOf") && o.contains_key("oneOf") {
                return Err(bad(at, "`anyOf` beside `oneOf` is not supported"));
            }
            let union = self.union(alts, at)?;
            if !union.branches.is_empty() {
                // Read along each branch: other constraints would have to apply to every one.
                if !only_annotations_beside(o, &["anyOf", "oneOf"]) {
                    return Err(bad(
                        at,
                        "an `anyOf`/`oneOf` of branches of the same JSON type beside other keywords is not supported",
                    ));
                }
                return Ok(union);
            }
            // Beside the merged branches only `type` (which narrows them): any other keyword
            // would overwrite what the branches set (a length, a pattern, their values).
            if !only_annotations_beside(o, &["anyOf", "oneOf", "type"]) {
                return Err(bad(
                    at,
                    "keywords other than `type` beside an `anyOf`/`oneOf` are not supported (move them into each branch)",
                ));
            }
            node.kinds &= union.kinds;
            node.object = union.object;
            node.array = union.array;
            node.literals = union.literals;
            node.min_len = union.min_len;
            node.max_len = union.max_len;
            node.pattern = union.pattern;
            node.int_range = union.int_range;
            node.dec_range = union.dec_range;
        }
        if let Some(lits) = literals(o, at)? {
            node.kinds &= lits.iter().fold(0, |k, l| k | literal_kind(l));
            node.literals = Some(lits);
        }
        match (&not_values, node.literals.take()) {
            (Some(values), None) => {
                negated.extend(negation::excluded_strings(values, node.kinds, at)?);
            }
            (Some(values), Some(lits)) => {
                let kept = literals::without_values(lits, values);
                if kept.is_empty() {
                    return Err(empty(at, "`not` excludes every value of its `enum`"));
                }
                node.kinds &= kept.iter().fold(0, |k, l| k | literal_kind(l));
                node.literals = Some(kept);
            }
            (None, lits) => node.literals = lits,
        }
        let object_keys = ["properties", "required", "additionalProperties"];
        if node.kinds & OBJECT != 0 && object_keys.iter().any(|k| o.contains_key(*k)) {
            self.object(o, at, &mut node.object)?;
        }
        if node.kinds & ARRAY != 0 {
            if let Some(prefix) = o.get("prefixItems") {
                let prefix = prefix
                    .as_array()
                    .ok_or_else(|| bad(at, "`prefixItems` must be an array"))?;
                node.array.prefix = Vec::new();
                for (i, p) in prefix.iter().enumerate() {
                    let n = self.node(p, &format!("{at}/prefixItems/{i}"))?;
                    node.array.prefix.push(n);
                }
            }
            match o.get("items") {
                None => {}
                // No items past the prefix (tuples).
                Some(Value::Bool(false)) => node.array.max = Some(node.array.prefix.len()),
                Some(items) => node.array.items = self.node(items, &format!("{at}/items"))?,
            }
            node.array.min = count(o, "minItems", at)?.unwrap_or(node.array.min);
            node.array.max = match (count(o, "maxItems", at)?, node.array.max) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if node.array.max.is_some_and(|m| m < node.array.min) {
                return Err(bad(at, "maxItems is below minItems"));
            }
        }
        let format = o
            .get("format")
            .and_then(Value::as_str)
            .and_then(format_regex);
        // Every pattern the string must match: its own, those an `allOf` merge added, and an
        // enforced format's.
        let mut patterns = Vec::new();
        match o.get("pattern") {
            Some(Value::String(p)) => patterns.push(p.clone()),
            Some(_) => return Err(bad(at, "`pattern` must be a string")),
            None => {}
        }
        if let Some(more) = o.get(MORE_PATTERNS).and_then(Value::as_array) {
            patterns.extend(more.iter().filter_map(Value::as_str).map(str::to_string));
        }
        patterns.extend(format);
        if !patterns.is_empty() || !negated.is_empty() {
            self.patterns.push(Pattern::new(&patterns, &negated, at)?);
            node.pattern = Some(self.patterns.len() - 1);
        }
        self.bounds(o, at, &mut node)?;
        node.min_len = count(o, "minLength", at)?.unwrap_or(node.min_len);
        node.max_len = count(o, "maxLength", at)?.or(node.max_len);
        if node.max_len.is_some_and(|m| m < node.min_len) {
            return Err(bad(at, "maxLength is below minLength"));
        }
        if node.kinds == 0 {
            return Err(empty(at, "no value satisfies these types"));
        }
        if node.literals.is_some() {
            self.literals_within(&mut node, o, at)?;
        }
        Ok(node)
    }

    /// `minimum`/`maximum` and their exclusive forms: an integer's (`int_range`) or a number's
    /// (`dec_range`, where the type admits fractions); `multipleOf` on either.
    fn bounds(&self, o: &Map<String, Value>, at: &str, node: &mut Node) -> Result<()> {
        self.range(o, at, node)?;
        let Some(m) = o.get("multipleOf") else {
            return Ok(());
        };
        numbers_only(node, at, "`multipleOf` is")?;
        if node.kinds & NUMBER != 0 {
            // A number's divisor in units of 10^-18; the value then takes no exponent.
            let step = m
                .as_f64()
                .ok_or_else(|| bad(at, "`multipleOf` must be a number"))?;
            let all = DecRange::new(None, None, None, None)
                .map_err(|e| bad(at, e))?
                .expect("the whole range is not empty");
            node.dec_range = Some(
                node.dec_range
                    .unwrap_or(all)
                    .multiples_of(step)
                    .map_err(|e| bad(at, e))?
                    .ok_or_else(|| {
                        bad(at, "no multiple of `multipleOf` lies within these bounds")
                    })?,
            );
            return Ok(());
        }
        let step = m
            .as_u64()
            .filter(|s| (1..=999_999_999_999_999_999).contains(s))
            .ok_or_else(|| bad(at, "`multipleOf` must be a positive integer below 10^18"))?;
        let all = IntRange::new(None, None, None, None).expect("the whole range is not empty");
        node.int_range = Some(
            node.int_range
                .unwrap_or(all)
                .multiples_of(step as i128)
                .ok_or_else(|| bad(at, "no multiple of `multipleOf` lies within these bounds"))?,
        );
        Ok(())
    }

    /// `minimum`/`maximum` and their exclusive forms.
    fn range(&self, o: &Map<String, Value>, at: &str, node: &mut Node) -> Result<()> {
        let keys = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
        let mut v = [None; 4];
        for (slot, key) in v.iter_mut().zip(keys) {
            *slot = match o.get(key) {
                None => None,
                Some(x) => Some(
                    x.as_f64()
                        .ok_or_else(|| bad(at, format!("`{key}` must be a number")))?,
                ),
            };
        }
        if v.iter().all(Option::is_none) {
            return Ok(());
        }
        numbers_only(node, at, "`minimum`/`maximum` are")?;
        if node.kinds & NUMBER != 0 {
            node.dec_range = Some(
                DecRange::new(v[0], v[1], v[2], v[3])
                    .map_err(|e| bad(at, e))?
                    .ok_or_else(|| bad(at, "no number lies within these bounds"))?,
            );
            return Ok(());
        }
        node.int_range = Some(
            IntRange::new(v[0], v[1], v[2], v[3])
                .ok_or_else(|| bad(at, "no integer lies within these bounds"))?,
        );
        Ok(())
    }

    fn object(&mut self, o: &Map<String, Value>, at: &str, spec: &mut ObjectSpec) -> Result<()> {
        let props = match o.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(bad(at, "`properties` must be an object")),
        };
        if let Some(props) = props {
            if props.len() > MAX_ALTERNATIVES {
                return Err(bad(at, format!("more than {MAX_ALTERNATIVES} properties")));
            }
            spec.props.clear();
            for (name, sub) in props {
                let i = self.node(sub, &format!("{at}/properties/{name}"))?;
                spec.props.push((escaped(name), i));
            }
        }
        spec.required = 0;
        match o.get("required") {
            None => {}
            Some(Value::Array(names)) => {
                for n in names {
                    let n = n
                        .as_str()
                        .ok_or_else(|| bad(at, "`required` must list strings"))?;
                    let key = escaped(n);
                    match spec.props.iter().position(|p| p.0 == key) {
                        Some(i) => spec.required |= 1 << i,
                        None => {
                            return Err(bad(
                                at,
                                format!("required property {n:?} has no schema in `properties`"),
                            ))
                        }
                    }
                }
            }
            Some(_) => return Err(bad(at, "`required` must be an array")),
        }
        spec.additional = match o.get("additionalProperties") {
            None | Some(Value::Bool(true)) => Some(ANY),
            Some(Value::Bool(false)) => None,
            Some(v) => Some(self.node(v, &format!("{at}/additionalProperties"))?),
        };
        Ok(())
    }
}

fn forks(nodes: &[Node]) -> bool {
    nodes.iter().any(|n| !n.branches.is_empty())
}

fn kinds_of(t: &Value, at: &str) -> Result<u8> {
    let one = |s: &str| -> Result<u8> {
        Ok(match s {
            "null" => NULL,
            "boolean" => BOOL,
            "integer" => INTEGER,
            "number" => NUMBER | INTEGER,
            "string" => STRING,
            "object" => OBJECT,
            "array" => ARRAY,
            other => return Err(bad(at, format!("unknown type {other:?}"))),
        })
    };
    match t {
        Value::String(s) => one(s),
        Value::Array(list) => list.iter().try_fold(0, |acc, s| {
            let s = s
                .as_str()
                .ok_or_else(|| bad(at, "`type` must list strings"))?;
            Ok(acc | one(s)?)
        }),
        _ => Err(bad(at, "`type` must be a string or an array of strings")),
    }
}

fn count(o: &Map<String, Value>, key: &str, at: &str) -> Result<Option<usize>> {
    match o.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| bad(at, format!("`{key}` must be a non-negative integer"))),
    }
}

/// A property name as it appears between the quotes of serde_json's compact output.
fn escaped(name: &str) -> Vec<u8> {
    let quoted = serde_json::to_vec(name).expect("strings serialize");
    quoted[1..quoted.len() - 1].to_vec()
}
