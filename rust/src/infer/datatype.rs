//! Triton's tensor datatypes as they travel on the wire (`"FP32"`, `"BYTES"`, ...).

/// A tensor datatype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    /// Elements of any length, each preceded on the wire by its length (4 bytes, little end
    /// first).
    Bytes,
}

const NAMES: [(DataType, &str); 14] = [
    (DataType::Bool, "BOOL"),
    (DataType::Uint8, "UINT8"),
    (DataType::Uint16, "UINT16"),
    (DataType::Uint32, "UINT32"),
    (DataType::Uint64, "UINT64"),
    (DataType::Int8, "INT8"),
    (DataType::Int16, "INT16"),
    (DataType::Int32, "INT32"),
    (DataType::Int64, "INT64"),
    (DataType::Fp16, "FP16"),
    (DataType::Fp32, "FP32"),
    (DataType::Fp64, "FP64"),
    (DataType::Bf16, "BF16"),
    (DataType::Bytes, "BYTES"),
];

impl DataType {
    /// The datatype a wire name names.
    pub fn from_name(name: &str) -> Option<Self> {
        NAMES.iter().find(|(_, n)| *n == name).map(|(t, _)| *t)
    }

    /// Its wire name.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(t, _)| *t == self)
            .map_or("", |(_, n)| n)
    }

    /// Bytes per element; None for `BYTES`, whose elements vary.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (datatype, name) in NAMES {
            assert_eq!(DataType::from_name(name), Some(datatype));
            assert_eq!(datatype.name(), name);
        }
        assert_eq!(DataType::from_name("TYPE_FP32"), None);
        assert_eq!(DataType::Bytes.element_size(), None);
    }
}
