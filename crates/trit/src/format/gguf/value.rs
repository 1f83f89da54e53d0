//! GGUF metadata values: scalars, strings and typed (possibly nested) arrays.

use super::value_type;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed array (a tokenizer vocabulary is one `String` array, not 150k boxed values).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn type_id(&self) -> u32 {
        use value_type::*;
        match self {
            Value::U8(_) => U8,
            Value::I8(_) => I8,
            Value::U16(_) => U16,
            Value::I16(_) => I16,
            Value::U32(_) => U32,
            Value::I32(_) => I32,
            Value::F32(_) => F32,
            Value::Bool(_) => BOOL,
            Value::String(_) => STRING,
            Value::Array(_) => ARRAY,
            Value::U64(_) => U64,
            Value::I64(_) => I64,
            Value::F64(_) => F64,
        }
    }

    /// Short type name for messages ("u32", "array of string", ...).
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type_name()),
            v => type_name_of(v.type_id()).to_string(),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type that holds a non-negative value (writers disagree on u32 vs u64).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_usize(&self) -> Option<usize> {
        self.as_u64().and_then(|v| usize::try_from(v).ok())
    }

    /// F32 or F64 (narrowed), or an integer (sampling defaults are sometimes written as ints).
    pub fn as_f32(&self) -> Option<f32> {
        self.as_f64().map(|v| v as f32)
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_str_array(&self) -> Option<&[String]> {
        match self.as_array()? {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_i32_array(&self) -> Option<&[i32]> {
        match self.as_array()? {
            Array::I32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_u32_array(&self) -> Option<&[u32]> {
        match self.as_array()? {
            Array::U32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32_array(&self) -> Option<&[f32]> {
        match self.as_array()? {
            Array::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_u8_array(&self) -> Option<&[u8]> {
        match self.as_array()? {
            Array::U8(v) => Some(v),
            _ => None,
        }
    }

    /// Any integer array widened to i64 (e.g. sign vectors whose element type is unconfirmed).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        self.as_array()?.to_i64_vec()
    }

    /// Any float or integer array widened to f32.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        let a = self.as_array()?;
        match a {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => a
                .to_i64_vec()
                .map(|v| v.into_iter().map(|x| x as f32).collect()),
        }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type id as written in the file.
    pub fn elem_type_id(&self) -> u32 {
        use value_type::*;
        match self {
            Array::U8(_) => U8,
            Array::I8(_) => I8,
            Array::U16(_) => U16,
            Array::I16(_) => I16,
            Array::U32(_) => U32,
            Array::I32(_) => I32,
            Array::F32(_) => F32,
            Array::Bool(_) => BOOL,
            Array::String(_) => STRING,
            Array::Array(_) => ARRAY,
            Array::U64(_) => U64,
            Array::I64(_) => I64,
            Array::F64(_) => F64,
        }
    }

    pub fn elem_type_name(&self) -> &'static str {
        type_name_of(self.elem_type_id())
    }

    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn widen<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            Array::U8(v) => widen(v, |x| Some(x.into())),
            Array::I8(v) => widen(v, |x| Some(x.into())),
            Array::U16(v) => widen(v, |x| Some(x.into())),
            Array::I16(v) => widen(v, |x| Some(x.into())),
            Array::U32(v) => widen(v, |x| Some(x.into())),
            Array::I32(v) => widen(v, |x| Some(x.into())),
            Array::U64(v) => widen(v, |x| i64::try_from(x).ok()),
            Array::I64(v) => Some(v.clone()),
            _ => None,
        }
    }
}

fn type_name_of(id: u32) -> &'static str {
    [
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
        "f64",
    ]
    .get(id as usize)
    .copied()
    .unwrap_or("unknown")
}
