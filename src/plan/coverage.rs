//! Completeness of service: every selection of every event is served by exactly one pass.
//!
//! An event is one MoE layer's passes for one ubatch. The engine builds the passes; the Plan
//! forms the groups. Should the two disagree (more groups than passes, a pass skipped, a group
//! served twice), rows of the layer would silently keep stale or unwritten outputs, so the run
//! counts what each event demanded and what its passes served, and fails closed on a mismatch.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// How service disagreed with demand: the run fails closed with the first of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoverageError {
    UnknownLayer {
        layer: u32,
    },
    NoPassZero {
        layer: u32,
        pass: u32,
    },
    PassOutOfOrder {
        layer: u32,
        pass: u32,
        due: u32,
    },
    OtherSelection {
        layer: u32,
        pass: u32,
    },
    OutsideEvent {
        layer: u32,
        pass: u32,
    },
    SlotsLength {
        layer: u32,
        pass: u32,
        slots: usize,
        selections: usize,
    },
    ServedTwice {
        layer: u32,
        index: usize,
        expert: i32,
        pass: u32,
    },
    /// An event closed with selections no pass served (`expert` the first of them).
    Incomplete {
        layer: u32,
        served: u64,
        demanded: u64,
        passes: u32,
        expert: i32,
    },
}

impl fmt::Display for CoverageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CoverageError::UnknownLayer { layer } => write!(f, "layer {layer} is not a managed MoE layer"),
            CoverageError::NoPassZero { layer, pass } => write!(f, "layer {layer}: pass {pass} without a pass 0 before it"),
            CoverageError::PassOutOfOrder { layer, pass, due } => {
                write!(f, "layer {layer}: pass {pass} where pass {due} was due (a pass was skipped or repeated)")
            }
            CoverageError::OtherSelection { layer, pass } => {
                write!(f, "layer {layer}: pass {pass} selects other experts than pass 0 of its event")
            }
            CoverageError::OutsideEvent { layer, pass } => write!(f, "layer {layer}: pass {pass} served outside an event"),
            CoverageError::SlotsLength { layer, pass, slots, selections } => {
                write!(f, "layer {layer}: pass {pass} wrote {slots} slots for {selections} selections")
            }
            CoverageError::ServedTwice { layer, index, expert, pass } => {
                write!(f, "layer {layer}: selection {index} (expert {expert}) served twice, again by pass {pass}")
            }
            CoverageError::Incomplete { layer, served, demanded, passes, expert } => write!(
                f,
                "layer {layer}: an event served {served} of {demanded} selections in {passes} passes (expert {expert} never served): \
                 incomplete service"
            ),
        }
    }
}

impl std::error::Error for CoverageError {}

/// Per MoE layer: events, passes, selections demanded and selections served.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LayerCoverage {
    pub layer: u32,
    pub events: u64,
    pub passes: u64,
    pub demanded: u64,
    pub served: u64,
}

#[derive(Debug)]
struct OpenEvent {
    ids: Vec<i32>,
    served: Vec<bool>,
    n_served: u64,
    passes: u32,
}

#[derive(Debug, Default)]
pub struct Coverage {
    layers: BTreeMap<u32, LayerCoverage>,
    open: BTreeMap<u32, OpenEvent>,
    /// Events left open by a failed decode: never complete, never counted as served.
    abandoned: u64,
    error: Option<CoverageError>,
}

/// What a record carries about the completeness of service.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct CoverageReport {
    /// Every closed event was served exactly, and no event is open.
    pub complete: bool,
    pub error: Option<String>,
    pub abandoned_events: u64,
    pub layers: Vec<LayerCoverage>,
}

impl Coverage {
    pub fn new(layers: impl IntoIterator<Item = u32>) -> Coverage {
        Coverage {
            layers: layers.into_iter().map(|layer| (layer, LayerCoverage { layer, ..Default::default() })).collect(),
            ..Default::default()
        }
    }

    /// Before the acquire of (layer, pass) with the event's selections `ids`: pass 0 closes the
    /// layer's previous event and opens the next; a later pass must continue the open event.
    pub fn begin(&mut self, layer: u32, pass: u32, ids: &[i32]) -> Result<(), CoverageError> {
        self.check()?;
        let r = self.begin_inner(layer, pass, ids);
        self.keep(r)
    }

    /// After the acquire of (layer, pass) wrote `slots`: the selections it served.
    pub fn served(&mut self, layer: u32, pass: u32, slots: &[i32]) -> Result<(), CoverageError> {
        self.check()?;
        let r = self.served_inner(layer, pass, slots);
        self.keep(r)
    }

    /// Closes every open event (a decode returned): each must be served exactly. After a
    /// failure the events still open are abandoned.
    pub fn close_all(&mut self) -> Result<(), CoverageError> {
        let layers: Vec<u32> = self.open.keys().copied().collect();
        for layer in layers {
            if self.error.is_some() {
                break;
            }
            let r = self.close(layer);
            let _ = self.keep(r);
        }
        if let Err(e) = self.check() {
            self.abandon();
            return Err(e);
        }
        Ok(())
    }

    /// A decode failed: its open events can never complete; they are counted, not closed.
    pub fn abandon(&mut self) {
        self.abandoned += self.open.len() as u64;
        self.open.clear();
    }

    /// Events still open (a decode whose end was never reported).
    pub fn open_events(&self) -> usize {
        self.open.len()
    }

    pub fn error(&self) -> Option<&CoverageError> {
        self.error.as_ref()
    }

    pub fn report(&self) -> CoverageReport {
        CoverageReport {
            complete: self.error.is_none() && self.open.is_empty(),
            error: self.error.as_ref().map(ToString::to_string),
            abandoned_events: self.abandoned,
            layers: self.layers.values().cloned().collect(),
        }
    }

    fn check(&self) -> Result<(), CoverageError> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn keep(&mut self, r: Result<(), CoverageError>) -> Result<(), CoverageError> {
        if let Err(e) = &r {
            self.error.get_or_insert_with(|| e.clone());
        }
        r
    }

    fn begin_inner(&mut self, layer: u32, pass: u32, ids: &[i32]) -> Result<(), CoverageError> {
        if !self.layers.contains_key(&layer) {
            return Err(CoverageError::UnknownLayer { layer });
        }
        if pass == 0 {
            if self.open.contains_key(&layer) {
                self.close(layer)?;
            }
            let lc = self.layers.get_mut(&layer).expect("checked");
            lc.events += 1;
            lc.demanded += ids.len() as u64;
            self.open.insert(layer, OpenEvent { ids: ids.to_vec(), served: vec![false; ids.len()], n_served: 0, passes: 0 });
            return Ok(());
        }
        let event = self.open.get(&layer).ok_or(CoverageError::NoPassZero { layer, pass })?;
        if pass != event.passes {
            return Err(CoverageError::PassOutOfOrder { layer, pass, due: event.passes });
        }
        if event.ids != ids {
            return Err(CoverageError::OtherSelection { layer, pass });
        }
        Ok(())
    }

    fn served_inner(&mut self, layer: u32, pass: u32, slots: &[i32]) -> Result<(), CoverageError> {
        let event = self.open.get_mut(&layer).ok_or(CoverageError::OutsideEvent { layer, pass })?;
        if slots.len() != event.served.len() {
            return Err(CoverageError::SlotsLength { layer, pass, slots: slots.len(), selections: event.served.len() });
        }
        let mut n = 0;
        for (i, _) in slots.iter().enumerate().filter(|(_, &s)| s >= 0) {
            if std::mem::replace(&mut event.served[i], true) {
                return Err(CoverageError::ServedTwice { layer, index: i, expert: event.ids[i], pass });
            }
            n += 1;
        }
        event.n_served += n;
        event.passes += 1;
        let lc = self.layers.get_mut(&layer).expect("open events are of managed layers");
        lc.served += n;
        lc.passes += 1;
        Ok(())
    }

    fn close(&mut self, layer: u32) -> Result<(), CoverageError> {
        let Some(event) = self.open.remove(&layer) else { return Ok(()) };
        let demanded = event.ids.len() as u64;
        if event.n_served != demanded {
            let first = event.served.iter().position(|s| !s).unwrap_or(0);
            return Err(CoverageError::Incomplete {
                layer,
                served: event.n_served,
                demanded,
                passes: event.passes,
                expert: event.ids.get(first).copied().unwrap_or(-1),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_served_exactly_once_is_complete() {
        let mut c = Coverage::new([0, 1]);
        c.begin(0, 0, &[3, 1, 3, 2]).unwrap();
        c.served(0, 0, &[0, -1, 0, 1]).unwrap();
        c.begin(0, 1, &[3, 1, 3, 2]).unwrap();
        c.served(0, 1, &[-1, 0, -1, -1]).unwrap();
        // An empty pass past the last group serves nothing and is fine.
        c.begin(0, 2, &[3, 1, 3, 2]).unwrap();
        c.served(0, 2, &[-1, -1, -1, -1]).unwrap();
        c.begin(1, 0, &[5]).unwrap();
        c.served(1, 0, &[2]).unwrap();
        c.close_all().unwrap();
        let r = c.report();
        assert!(r.complete, "{r:?}");
        assert_eq!(r.layers[0], LayerCoverage { layer: 0, events: 1, passes: 3, demanded: 4, served: 4 });
        assert_eq!(r.layers[1], LayerCoverage { layer: 1, events: 1, passes: 1, demanded: 1, served: 1 });
    }

    #[test]
    fn a_missing_pass_fails_when_the_next_event_of_the_layer_begins() {
        let mut c = Coverage::new([0]);
        c.begin(0, 0, &[0, 1, 2]).unwrap();
        c.served(0, 0, &[0, 1, -1]).unwrap();
        let e = c.begin(0, 0, &[0]).unwrap_err();
        assert_eq!(e, CoverageError::Incomplete { layer: 0, served: 2, demanded: 3, passes: 1, expert: 2 });
        assert!(!c.report().complete);
        // The first error stays; nothing later is accepted.
        assert_eq!(c.begin(0, 0, &[0]).unwrap_err(), e);
        assert_eq!(c.report().error, Some(e.to_string()));
    }

    #[test]
    fn an_incomplete_last_event_fails_at_close() {
        let mut c = Coverage::new([0]);
        c.begin(0, 0, &[0, 1]).unwrap();
        c.served(0, 0, &[0, -1]).unwrap();
        assert!(matches!(c.close_all(), Err(CoverageError::Incomplete { served: 1, demanded: 2, .. })));
        assert_eq!(c.open_events(), 0);
    }

    #[test]
    fn events_open_at_a_failure_are_abandoned() {
        let mut c = Coverage::new([0, 1]);
        c.begin(0, 0, &[0, 1]).unwrap();
        c.served(0, 0, &[0, -1]).unwrap();
        c.begin(1, 0, &[0]).unwrap();
        c.served(1, 0, &[0]).unwrap();
        assert!(c.close_all().is_err());
        let r = c.report();
        assert_eq!((c.open_events(), r.abandoned_events, r.complete), (0, 1, false));
    }

    #[test]
    fn a_selection_served_twice_fails() {
        let mut c = Coverage::new([0]);
        c.begin(0, 0, &[0, 1]).unwrap();
        c.served(0, 0, &[0, -1]).unwrap();
        c.begin(0, 1, &[0, 1]).unwrap();
        let e = c.served(0, 1, &[1, 0]).unwrap_err();
        assert_eq!(e, CoverageError::ServedTwice { layer: 0, index: 0, expert: 0, pass: 1 });
    }

    #[test]
    fn skipped_repeated_or_orphan_passes_and_changed_ids_fail() {
        let mut c = Coverage::new([0]);
        assert_eq!(c.begin(0, 1, &[0]), Err(CoverageError::NoPassZero { layer: 0, pass: 1 }));
        let mut c = Coverage::new([0]);
        c.begin(0, 0, &[0, 1]).unwrap();
        c.served(0, 0, &[0, -1]).unwrap();
        assert_eq!(c.begin(0, 2, &[0, 1]), Err(CoverageError::PassOutOfOrder { layer: 0, pass: 2, due: 1 }));
        let mut c = Coverage::new([0]);
        c.begin(0, 0, &[0, 1]).unwrap();
        c.served(0, 0, &[0, -1]).unwrap();
        assert_eq!(c.begin(0, 1, &[0, 2]), Err(CoverageError::OtherSelection { layer: 0, pass: 1 }));
        let mut c = Coverage::new([0]);
        assert_eq!(c.begin(7, 0, &[0]), Err(CoverageError::UnknownLayer { layer: 7 }));
    }

    #[test]
    fn a_failed_decode_abandons_its_open_events() {
        let mut c = Coverage::new([0]);
        c.begin(0, 0, &[0, 1]).unwrap();
        c.served(0, 0, &[0, -1]).unwrap();
        c.abandon();
        let r = c.report();
        assert_eq!((r.abandoned_events, r.complete, r.error), (1, true, None));
        assert_eq!(r.layers[0].served, 1);
    }
}
