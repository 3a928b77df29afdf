//! The ggml tensor types a GGUF file may hold, with block size and bytes per block.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GgmlType(pub u32);

/// (id, name, elements per block, bytes per block); ids missing here were removed from ggml.
const TABLE: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
    (42, "Q2_0", 64, 18),
];

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const I32: GgmlType = GgmlType(26);

    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        TABLE.iter().find(|e| e.0 == self.0)
    }

    pub fn is_known(self) -> bool {
        self.entry().is_some()
    }

    pub fn name(self) -> &'static str {
        self.entry().map(|e| e.1).unwrap_or("unknown")
    }

    /// Elements per block.
    pub fn block_size(self) -> Option<u64> {
        self.entry().map(|e| e.2)
    }

    /// Bytes per block.
    pub fn type_size(self) -> Option<u64> {
        self.entry().map(|e| e.3)
    }

    /// Bytes of a tensor of this type with these dimensions, if the first dimension is a whole
    /// number of blocks and nothing overflows.
    pub fn tensor_bytes(self, dims: &[u64]) -> Option<u64> {
        let (blck, size) = (self.block_size()?, self.type_size()?);
        let ne0 = *dims.first()?;
        if ne0 % blck != 0 {
            return None;
        }
        let row = (ne0 / blck).checked_mul(size)?;
        dims[1..].iter().try_fold(row, |acc, &d| acc.checked_mul(d))
    }

    /// Every type this table knows, for comparison against the engine's own table.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|e| GgmlType(e.0))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.entry() {
            Some(e) => f.write_str(e.1),
            None => write!(f, "type#{}", self.0),
        }
    }
}
