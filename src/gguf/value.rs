//! Metadata values of a GGUF file: the thirteen value types, arrays of them (nested too), and typed accessors.

/// The type tag of a metadata value, as stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    pub fn from_u32(v: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_bytes(self) -> Option<u64> {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value: its element type and elements (which may themselves be arrays).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufArray {
    pub elem_type: GgufValueType,
    pub values: Vec<GgufValue>,
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v as i64),
            GgufValue::I16(v) => Some(v as i64),
            GgufValue::I32(v) => Some(v as i64),
            GgufValue::I64(v) => Some(v),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => self.as_u64().map(|v| v as i64),
        }
    }

    /// The value as a float, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short human-readable rendering; long arrays are summarised.
    pub fn display_short(&self) -> String {
        match self {
            GgufValue::String(s) if s.chars().count() > 80 => {
                let head: String = s.chars().take(77).collect();
                format!("{head:?}...")
            }
            GgufValue::String(s) => format!("{s:?}"),
            GgufValue::Array(a) if a.values.len() > 8 => {
                let head: Vec<String> = a.values.iter().take(4).map(|v| v.display_short()).collect();
                format!("[{}, ... ({} {:?} values)]", head.join(", "), a.values.len(), a.elem_type)
            }
            GgufValue::Array(a) => {
                let all: Vec<String> = a.values.iter().map(|v| v.display_short()).collect();
                format!("[{}]", all.join(", "))
            }
            GgufValue::U8(v) => v.to_string(),
            GgufValue::I8(v) => v.to_string(),
            GgufValue::U16(v) => v.to_string(),
            GgufValue::I16(v) => v.to_string(),
            GgufValue::U32(v) => v.to_string(),
            GgufValue::I32(v) => v.to_string(),
            GgufValue::U64(v) => v.to_string(),
            GgufValue::I64(v) => v.to_string(),
            GgufValue::F32(v) => v.to_string(),
            GgufValue::F64(v) => v.to_string(),
            GgufValue::Bool(v) => v.to_string(),
        }
    }
}

impl GgufArray {
    /// The elements as strings, if this is an array of strings.
    pub fn strings(&self) -> Option<Vec<&str>> {
        self.values.iter().map(|v| v.as_str()).collect()
    }

    /// The elements as f32, if they are numbers.
    pub fn f32s(&self) -> Option<Vec<f32>> {
        self.values.iter().map(|v| v.as_f64().map(|x| x as f32)).collect()
    }

    /// The elements as i64, if they are integers.
    pub fn i64s(&self) -> Option<Vec<i64>> {
        self.values.iter().map(|v| v.as_i64()).collect()
    }
}
