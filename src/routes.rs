//! The `routes` surface's codec: per route event its ubatch, row, pos and layer as u32 LE, then
//! its k expert ids as i32 LE. `generate` writes it with [`encode`]; readers take it back with
//! [`decode`], which refuses anything the engine could not have written.

use serde::Serialize;
use std::fmt;

/// One token row's expert selection in one layer of one ubatch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteEvent {
    /// Ubatch counter since the context was created.
    pub ubatch: u32,
    /// Row within the ubatch.
    pub row: u32,
    /// Absolute token position (rows are decoded in order, each once).
    pub pos: u32,
    pub layer: u32,
    pub experts: Vec<i32>,
}

/// Route ids per event beyond this are refused as hostile (top-k of any real router is far less).
pub const MAX_K: usize = 4096;

/// Fills an event's ids up to the surface's k where its layer selects fewer (models that route
/// a different number of experts in each layer); never an expert id.
pub const PAD: i32 = -1;

/// Bytes of one event with `k` expert ids.
pub fn unit_bytes(k: usize) -> u64 {
    16 + 4 * k as u64
}

/// The surface's bytes for `events`, each with `k` ids: its own, then [`PAD`] up to `k` (`k` is
/// the most any layer selects).
pub fn encode(events: &[RouteEvent], k: usize) -> Vec<u8> {
    events
        .iter()
        .flat_map(|e| {
            let pad = std::iter::repeat_n(PAD, k.saturating_sub(e.experts.len()));
            [e.ubatch, e.row, e.pos, e.layer]
                .into_iter()
                .flat_map(u32::to_le_bytes)
                .chain(e.experts.iter().copied().chain(pad).flat_map(i32::to_le_bytes))
                .collect::<Vec<u8>>()
        })
        .collect()
}

/// Why a routes surface was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutesError {
    /// k outside 1..=MAX_K.
    K(usize),
    /// The length is not a whole number of events.
    Partial { bytes: usize, unit: usize, k: usize },
    /// A row other than the next one of its (ubatch, layer).
    Row { event: usize, ubatch: u32, layer: u32, row: u32, expected: u32 },
    /// A (ubatch, layer) not after the previous one, or one that does not start at row 0.
    Order { event: usize, ubatch: u32, layer: u32, row: u32 },
}

impl fmt::Display for RoutesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RoutesError::K(k) => write!(f, "route k = {k}: expected 1..={MAX_K}"),
            RoutesError::Partial { bytes, unit, k } => write!(f, "{bytes} bytes is not a whole number of {unit}-byte events (k = {k})"),
            RoutesError::Row { event, ubatch, layer, row, expected } => {
                write!(f, "event {event}: row {row} of ubatch {ubatch} layer {layer}, expected row {expected}")
            }
            RoutesError::Order { event, ubatch, layer, row } => {
                write!(f, "event {event}: ubatch {ubatch} layer {layer} row {row} is out of order")
            }
        }
    }
}

impl std::error::Error for RoutesError {}

/// The events of a routes surface with `k` ids each, less their trailing [`PAD`]. Within one
/// (ubatch, layer) rows come 0, 1, 2, ...; (ubatch, layer) pairs strictly increase.
pub fn decode(bytes: &[u8], k: usize) -> Result<Vec<RouteEvent>, RoutesError> {
    if k == 0 || k > MAX_K {
        return Err(RoutesError::K(k));
    }
    let unit = unit_bytes(k) as usize;
    if !bytes.len().is_multiple_of(unit) {
        return Err(RoutesError::Partial { bytes: bytes.len(), unit, k });
    }
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let mut out: Vec<RouteEvent> = Vec::with_capacity(bytes.len() / unit);
    for (event, e) in bytes.chunks_exact(unit).enumerate() {
        let (ubatch, row, pos, layer) = (u32_at(e, 0), u32_at(e, 1), u32_at(e, 2), u32_at(e, 3));
        match out.last() {
            Some(last) if last.ubatch == ubatch && last.layer == layer => {
                if row != last.row + 1 {
                    return Err(RoutesError::Row { event, ubatch, layer, row, expected: last.row + 1 });
                }
            }
            last => {
                let in_order = last.is_none_or(|l| ubatch > l.ubatch || (ubatch == l.ubatch && layer > l.layer));
                if !in_order || row != 0 {
                    return Err(RoutesError::Order { event, ubatch, layer, row });
                }
            }
        }
        let mut experts: Vec<i32> = (0..k).map(|i| u32_at(e, 4 + i) as i32).collect();
        while experts.last() == Some(&PAD) {
            experts.pop();
        }
        out.push(RouteEvent { ubatch, row, pos, layer, experts });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ubatch: u32, row: u32, pos: u32, layer: u32, experts: &[i32]) -> RouteEvent {
        RouteEvent { ubatch, row, pos, layer, experts: experts.to_vec() }
    }

    #[test]
    fn routes_round_trip_and_refuse_what_the_engine_never_writes() {
        let events = vec![ev(0, 0, 0, 1, &[3, 4]), ev(0, 1, 1, 1, &[4, -5]), ev(0, 0, 0, 2, &[0, 1]), ev(1, 0, 2, 1, &[7, 3])];
        let b = encode(&events, 2);
        assert_eq!(b.len() as u64, 4 * unit_bytes(2));
        assert_eq!(decode(&b, 2), Ok(events));
        assert!(matches!(decode(&b[..b.len() - 1], 2), Err(RoutesError::Partial { unit: 24, k: 2, .. })));
        assert_eq!(decode(&b, 0), Err(RoutesError::K(0)));
        assert_eq!(decode(&[], MAX_K + 1), Err(RoutesError::K(MAX_K + 1)));
        let back = encode(&[ev(0, 0, 0, 2, &[1]), ev(0, 0, 0, 1, &[1])], 1);
        assert_eq!(decode(&back, 1), Err(RoutesError::Order { event: 1, ubatch: 0, layer: 1, row: 0 }));
        let late = encode(&[ev(0, 1, 0, 2, &[1])], 1);
        assert_eq!(decode(&late, 1), Err(RoutesError::Order { event: 0, ubatch: 0, layer: 2, row: 1 }));
        let skip = encode(&[ev(0, 0, 0, 2, &[1]), ev(0, 2, 2, 2, &[1])], 1);
        assert_eq!(decode(&skip, 1), Err(RoutesError::Row { event: 1, ubatch: 0, layer: 2, row: 2, expected: 1 }));
    }

    /// Layers that select fewer experts than the surface's k are padded, and come back as they were.
    #[test]
    fn events_of_fewer_ids_are_padded_and_come_back_whole() {
        let events = vec![ev(0, 0, 0, 1, &[3, 4, 5, 6]), ev(0, 0, 0, 3, &[7, 2]), ev(1, 0, 1, 1, &[0, 1, 2, 3]), ev(1, 0, 1, 3, &[9])];
        let b = encode(&events, 4);
        assert_eq!(b.len() as u64, 4 * unit_bytes(4));
        assert_eq!(&b[unit_bytes(4) as usize + 24..unit_bytes(4) as usize + 32], [PAD.to_le_bytes(), PAD.to_le_bytes()].concat());
        assert_eq!(decode(&b, 4), Ok(events));
    }
}
