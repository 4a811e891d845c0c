//! Metadata values of a GGUF file: the thirteen value types, arrays of them (nested too, and stored by
//! element type so that they cost about their file bytes in memory), and typed accessors.

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

/// An array value. Its elements are stored compactly, one `Vec` of the element type, so that an array
/// costs about as many bytes in memory as in the file: a `u8` array of N elements is N bytes, not N
/// 32-byte [`GgufValue`]s. That bound is what keeps a corrupted length in a large file from turning into
/// an allocation many times the file's size.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufArray {
    data: ArrayData,
}

/// The elements of an array, by element type. Arrays of arrays hold their inner arrays, each with its own
/// element type (GGUF writes an element type per inner array).
#[derive(Clone, Debug, PartialEq)]
pub enum ArrayData {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// Runs `$body` with `$v` bound to the element `Vec` of `$data`, whatever its type.
macro_rules! with_elements {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            ArrayData::U8($v) => $body,
            ArrayData::I8($v) => $body,
            ArrayData::U16($v) => $body,
            ArrayData::I16($v) => $body,
            ArrayData::U32($v) => $body,
            ArrayData::I32($v) => $body,
            ArrayData::F32($v) => $body,
            ArrayData::Bool($v) => $body,
            ArrayData::String($v) => $body,
            ArrayData::Array($v) => $body,
            ArrayData::U64($v) => $body,
            ArrayData::I64($v) => $body,
            ArrayData::F64($v) => $body,
        }
    };
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

    /// True for integers of any width and sign.
    pub fn is_integer(&self) -> bool {
        use GgufValue::*;
        matches!(self, U8(_) | I8(_) | U16(_) | I16(_) | U32(_) | I32(_) | U64(_) | I64(_))
    }

    /// The value's type for messages: `a u32 (7)`, `a string ("llama")`, `an array of 3 string values`.
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(a) => format!("an array of {} {} values", a.len(), type_name(a.elem_type())),
            _ => {
                let name = type_name(self.value_type());
                format!("{} {name} ({})", article_for(name), self.display_short())
            }
        }
    }

    /// The type tag of this value.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
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
            GgufValue::Array(a) if a.len() > 8 => {
                let head: Vec<String> = a.iter().take(4).map(|v| v.display_short()).collect();
                format!("[{}, ... ({} {:?} values)]", head.join(", "), a.len(), a.elem_type())
            }
            GgufValue::Array(a) => {
                let all: Vec<String> = a.iter().map(|v| v.display_short()).collect();
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

/// The GGUF name of a value type: `u32`, `string`, `array`, ...
pub fn type_name(t: GgufValueType) -> &'static str {
    use GgufValueType::*;
    match t {
        U8 => "u8",
        I8 => "i8",
        U16 => "u16",
        I16 => "i16",
        U32 => "u32",
        I32 => "i32",
        F32 => "f32",
        Bool => "bool",
        String => "string",
        Array => "array",
        U64 => "u64",
        I64 => "i64",
        F64 => "f64",
    }
}

fn article_for(name: &str) -> &'static str {
    if name.starts_with(['a', 'i', 'f']) {
        "an"
    } else {
        "a"
    }
}

impl GgufArray {
    pub fn new(data: ArrayData) -> GgufArray {
        GgufArray { data }
    }

    /// An array of `elem_type` from single values, or `None` if one of them is not of that type.
    pub fn from_values(elem_type: GgufValueType, values: Vec<GgufValue>) -> Option<GgufArray> {
        // `GgufValue` and `ArrayData` name their variants alike.
        macro_rules! all {
            ($variant:ident) => {
                ArrayData::$variant(
                    values
                        .into_iter()
                        .map(|v| match v {
                            GgufValue::$variant(x) => Some(x),
                            _ => None,
                        })
                        .collect::<Option<Vec<_>>>()?,
                )
            };
        }
        let data = match elem_type {
            GgufValueType::U8 => all!(U8),
            GgufValueType::I8 => all!(I8),
            GgufValueType::U16 => all!(U16),
            GgufValueType::I16 => all!(I16),
            GgufValueType::U32 => all!(U32),
            GgufValueType::I32 => all!(I32),
            GgufValueType::F32 => all!(F32),
            GgufValueType::Bool => all!(Bool),
            GgufValueType::String => all!(String),
            GgufValueType::Array => all!(Array),
            GgufValueType::U64 => all!(U64),
            GgufValueType::I64 => all!(I64),
            GgufValueType::F64 => all!(F64),
        };
        Some(GgufArray { data })
    }

    /// The elements, stored by type.
    pub fn data(&self) -> &ArrayData {
        &self.data
    }

    pub fn into_data(self) -> ArrayData {
        self.data
    }

    /// The type of every element.
    pub fn elem_type(&self) -> GgufValueType {
        match self.data {
            ArrayData::U8(_) => GgufValueType::U8,
            ArrayData::I8(_) => GgufValueType::I8,
            ArrayData::U16(_) => GgufValueType::U16,
            ArrayData::I16(_) => GgufValueType::I16,
            ArrayData::U32(_) => GgufValueType::U32,
            ArrayData::I32(_) => GgufValueType::I32,
            ArrayData::F32(_) => GgufValueType::F32,
            ArrayData::Bool(_) => GgufValueType::Bool,
            ArrayData::String(_) => GgufValueType::String,
            ArrayData::Array(_) => GgufValueType::Array,
            ArrayData::U64(_) => GgufValueType::U64,
            ArrayData::I64(_) => GgufValueType::I64,
            ArrayData::F64(_) => GgufValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        with_elements!(&self.data, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a single value (a copy: strings and inner arrays are cloned).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        Some(match &self.data {
            ArrayData::U8(v) => GgufValue::U8(*v.get(i)?),
            ArrayData::I8(v) => GgufValue::I8(*v.get(i)?),
            ArrayData::U16(v) => GgufValue::U16(*v.get(i)?),
            ArrayData::I16(v) => GgufValue::I16(*v.get(i)?),
            ArrayData::U32(v) => GgufValue::U32(*v.get(i)?),
            ArrayData::I32(v) => GgufValue::I32(*v.get(i)?),
            ArrayData::F32(v) => GgufValue::F32(*v.get(i)?),
            ArrayData::Bool(v) => GgufValue::Bool(*v.get(i)?),
            ArrayData::String(v) => GgufValue::String(v.get(i)?.clone()),
            ArrayData::Array(v) => GgufValue::Array(v.get(i)?.clone()),
            ArrayData::U64(v) => GgufValue::U64(*v.get(i)?),
            ArrayData::I64(v) => GgufValue::I64(*v.get(i)?),
            ArrayData::F64(v) => GgufValue::F64(*v.get(i)?),
        })
    }

    /// Element `i`, borrowed, if this is an array of strings.
    pub fn get_str(&self, i: usize) -> Option<&str> {
        match &self.data {
            ArrayData::String(v) => v.get(i).map(String::as_str),
            _ => None,
        }
    }

    /// The elements as single values, in order (copies, as [`GgufArray::get`]).
    pub fn iter(&self) -> impl Iterator<Item = GgufValue> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The elements as strings, if this is an array of strings. (Every accessor below gives an empty
    /// array as an empty list, whatever its element type: some writers type empty arrays loosely.)
    pub fn strings(&self) -> Option<Vec<&str>> {
        match &self.data {
            ArrayData::String(v) => Some(v.iter().map(String::as_str).collect()),
            _ if self.is_empty() => Some(Vec::new()),
            _ => None,
        }
    }

    /// The elements as f32, if they are numbers (integers of any width, or floats).
    pub fn f32s(&self) -> Option<Vec<f32>> {
        self.numbers(|v| v.as_f64().map(|x| x as f32))
    }

    /// The elements as i64, if they are integers that fit.
    pub fn i64s(&self) -> Option<Vec<i64>> {
        self.numbers(GgufValue::as_i64)
    }

    /// Converts every element with `f`, through the same conversions as single values have; strings and
    /// inner arrays are never numbers, so those arrays are refused without copying their elements.
    fn numbers<T>(&self, f: impl Fn(&GgufValue) -> Option<T>) -> Option<Vec<T>> {
        match &self.data {
            ArrayData::String(_) | ArrayData::Array(_) if !self.is_empty() => None,
            _ => self.iter().map(|v| f(&v)).collect(),
        }
    }
}
