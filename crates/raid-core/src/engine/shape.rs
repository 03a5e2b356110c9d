//! The array's shape: which geometry each array sector lies in, as a value with a version,
//! and how a request finds its geometry while that changes.
//!
//! A [`Layout`] is one geometry placed on the devices: its member sectors start
//! `shift_sectors` after each device's data origin (a reshape writes the new layout into
//! headroom before or after the old one, md's `new_offset`). A [`Shape`] is the array's
//! layouts at one version: one layout when settled; during a reshape, the layout being
//! reshaped to and the previous one, with the *front* between them.
//!
//! Routing ([`ShapeCell::enter`]): a request enters with the current shape and gets the
//! layout of each part of its range: sectors on the reshaped side of the front are in the
//! new layout, the others in the previous one. A request that straddles the front is split
//! at it; one that touches the *window* (the sectors a reshape step is moving now) waits
//! until the window has moved. The front is aligned to the new layout's stripes (asserted),
//! as md moves it; a stripe of the previous layout may lie on both sides, each side using
//! its own copy of the stripe (the reshape never overwrites old rows still in use).
//!
//! Versions: every change installs a new `Shape` with a higher version ([`ShapeCell::install`]):
//! a reshape beginning, the front moving, a reshape ending, a takeover (a level change that
//! moves no data). A request keeps the shape it entered with until it completes; a window
//! closes only when no request in flight touches it ([`ShapeCell::close_window`]), and a
//! change of the devices' data origin happens while no request runs at all
//! ([`ShapeCell::pause`]).
//!
//! Invariants (asserted): versions only grow; the front only moves in the reshape's direction,
//! never past the window; a settled layout has no shift (a finished reshape moves the data
//! origin of every device instead); the export never grows while a reshape runs.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use event_listener::Event;

use crate::error::{ErrorKind, RaidError};
use crate::geometry::{Geometry, Mapped, ParityGeometry};

/// One geometry placed on the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    geometry: Geometry,
    /// Where its member sectors start, after each device's data origin.
    shift_sectors: u64,
}

impl Layout {
    pub fn new(geometry: Geometry, shift_sectors: u64) -> Self {
        Self { geometry, shift_sectors }
    }

    /// A layout at the devices' data origin (every settled array).
    pub fn settled(geometry: Geometry) -> Self {
        Self::new(geometry, 0)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn shift_sectors(&self) -> u64 {
        self.shift_sectors
    }

    /// Where `array_sector` lives, in member sectors from the devices' data origin.
    pub(crate) fn map(&self, array_sector: u64) -> Mapped {
        let mut mapped = self.geometry.map(array_sector);
        if self.shift_sectors != 0 {
            for c in &mut mapped.copies {
                c.member_sector += self.shift_sectors;
            }
        }
        mapped
    }

    /// The stripe geometry (raid4/5/6).
    pub(crate) fn parity(&self) -> Option<&ParityGeometry> {
        self.geometry.parity()
    }

    /// First member sector (from the data origin) of `stripe` of a parity layout.
    pub(crate) fn stripe_member_sector(&self, stripe: u64) -> u64 {
        self.parity().expect("a parity layout").stripe_member_sector(stripe) + self.shift_sectors
    }

    /// The unit a front must be aligned to: one stripe's data (raid4/5/6, as md's raid5
    /// moves whole stripes); any sector for raid10, whose `reshape_position` md takes
    /// anywhere (`reshape_request` pauses "in the middle of a chunk").
    fn alignment_sectors(&self) -> u64 {
        match self.parity() {
            Some(pg) => pg.stripe_data_sectors(),
            None => 1,
        }
    }

    /// The first member sector (from the data origin) of the rows holding `array_sector`:
    /// no array sector at or past it lies lower (md's `first_dev_address`). Levels that
    /// reshape: raid4/5/6 and raid10.
    pub(crate) fn first_member_sector(&self, array_sector: u64) -> u64 {
        self.shift_sectors
            + match (self.parity(), self.geometry.raid10()) {
                (Some(pg), _) => array_sector / pg.stripe_data_sectors() * u64::from(pg.chunk_sectors()),
                (None, Some(g)) => g.first_row_sector(array_sector),
                (None, None) => unreachable!("{} does not reshape", self.geometry.level()),
            }
    }

    /// The member sector past the rows holding `array_sector`: no array sector at or before
    /// it lies at or past it (md's `last_dev_address`).
    pub(crate) fn member_end_sector(&self, array_sector: u64) -> u64 {
        self.shift_sectors
            + match (self.parity(), self.geometry.raid10()) {
                (Some(pg), _) => (array_sector / pg.stripe_data_sectors() + 1) * u64::from(pg.chunk_sectors()),
                (None, Some(g)) => g.rows_end_sector(array_sector),
                (None, None) => unreachable!("{} does not reshape", self.geometry.level()),
            }
    }
}

/// Which way a reshape walks the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From sector 0 up: sectors below the front are in the new layout (md's default, growing).
    Forward,
    /// From the end down: sectors at or above the front are in the new layout (md's
    /// `reshape_backwards`, shrinking).
    Backward,
}

/// A reshape in progress: the previous layout and where the new one ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshape {
    pub previous: Arc<Layout>,
    /// Array sectors: md's `reshape_position`.
    pub front_sectors: u64,
    pub direction: Direction,
}

impl Reshape {
    /// Whether `sector` is on the reshaped side of the front.
    fn is_new(&self, sector: u64) -> bool {
        match self.direction {
            Direction::Forward => sector < self.front_sectors,
            Direction::Backward => sector >= self.front_sectors,
        }
    }
}

/// The array's layouts at one version.
#[derive(Debug)]
pub struct Shape {
    version: u64,
    layout: Arc<Layout>,
    reshape: Option<Reshape>,
}

impl Shape {
    pub fn settled(layout: Layout) -> Self {
        Self::new(0, Arc::new(layout), None)
    }

    /// The first shape of an array found mid-reshape.
    pub(crate) fn reshaping(layout: Layout, reshape: Reshape) -> Self {
        Self::new(0, Arc::new(layout), Some(reshape))
    }

    fn new(version: u64, layout: Arc<Layout>, reshape: Option<Reshape>) -> Self {
        if reshape.is_none() {
            assert_eq!(layout.shift_sectors, 0, "a settled layout lies at the data origin");
        }
        if let Some(r) = &reshape {
            // md moves the front by whole stripes of the new layout (`reshape_request`); a stripe
            // of the previous layout may lie on both sides of it.
            let align = layout.alignment_sectors();
            let end = layout.geometry.array_sectors();
            assert!(
                r.front_sectors <= end && (r.front_sectors.is_multiple_of(align) || r.front_sectors == end),
                "reshape front {} not aligned to the new layout's stripes ({align} sectors) inside {end}",
                r.front_sectors
            );
        }
        Self { version, layout, reshape }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// The layout the array is in, or is being reshaped to.
    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    pub fn reshape(&self) -> Option<&Reshape> {
        self.reshape.as_ref()
    }

    /// Sectors clients see: during a reshape the smaller of the two layouts (a grow shows
    /// its new size when it ends, a shrink its smaller size before it starts, as md).
    pub fn export_sectors(&self) -> u64 {
        let new = self.layout.geometry.array_sectors();
        match &self.reshape {
            Some(r) => new.min(r.previous.geometry.array_sectors()),
            None => new,
        }
    }

    /// Whether every byte is still there with `missing` roles gone (in both layouts).
    pub fn survives(&self, missing: &[usize]) -> bool {
        self.layout.geometry.survives(missing)
            && self.reshape.as_ref().is_none_or(|r| r.previous.geometry.survives(missing))
    }

    /// Failures the array survives at most (the smaller of the two layouts' redundancy).
    pub fn max_failures(&self) -> usize {
        let new = self.layout.geometry.max_failures();
        self.reshape.as_ref().map_or(new, |r| new.min(r.previous.geometry.max_failures()))
    }

    /// The layout of each part of `[start, start + sectors)`: one part, or two split at the front.
    fn parts(&self, start: u64, sectors: u64) -> Parts {
        let Some(r) = &self.reshape else {
            return Parts::One(Part { layout: self.layout.clone(), start, sectors });
        };
        let end = start + sectors;
        let side = |s: u64| if r.is_new(s) { self.layout.clone() } else { r.previous.clone() };
        if start < r.front_sectors && r.front_sectors < end {
            let first = r.front_sectors - start;
            return Parts::Two(
                Part { layout: side(start), start, sectors: first },
                Part { layout: side(r.front_sectors), start: r.front_sectors, sectors: sectors - first },
            );
        }
        Parts::One(Part { layout: side(start), start, sectors })
    }
}

/// A run of array sectors in one layout.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub layout: Arc<Layout>,
    pub start: u64,
    pub sectors: u64,
}

/// A request's range, by layout.
#[derive(Debug, Clone)]
pub(crate) enum Parts {
    One(Part),
    Two(Part, Part),
}

impl Parts {
    pub fn iter(&self) -> impl Iterator<Item = &Part> {
        let (a, b) = match self {
            Parts::One(a) => (a, None),
            Parts::Two(a, b) => (a, Some(b)),
        };
        std::iter::once(a).chain(b)
    }
}

/// Where requests in flight are, while a reshape runs.
#[derive(Debug, Default)]
struct Gate {
    /// The sectors a reshape step moves now: no request may touch them.
    window: Option<Range<u64>>,
    /// Ranges of requests in flight: (start, ticket) -> end.
    in_flight: BTreeMap<(u64, u64), u64>,
    next_ticket: u64,
}

impl Gate {
    fn touches(&self, range: &Range<u64>) -> bool {
        self.in_flight.iter().any(|(&(start, _), &end)| start < range.end && range.start < end)
    }
}

/// The array's current shape and the requests in flight on it.
pub(crate) struct ShapeCell {
    current: RwLock<Arc<Shape>>,
    gate: Mutex<Gate>,
    /// The window moved, or a request left the gate.
    gate_changed: Event,
    /// Highest version installed (asserts that versions only grow).
    last_version: AtomicU64,
    /// New requests wait (`pause`): the devices' data origin is being moved.
    paused: AtomicBool,
    /// Requests in flight, of every version; `idle` fires when it reaches 0.
    in_flight: AtomicUsize,
    idle: Event,
}

/// While held, no request runs (see [`ShapeCell::pause`]); dropping it lets them go on.
pub(crate) struct Paused<'a> {
    cell: &'a ShapeCell,
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.cell.paused.store(false, Ordering::SeqCst);
        self.cell.gate_changed.notify(usize::MAX);
    }
}

/// A request in flight: its parts, and its place in the shape it entered with. Dropping it
/// ends the request.
pub(crate) struct Entered<'a> {
    cell: &'a ShapeCell,
    shape: Arc<Shape>,
    pub parts: Parts,
    ticket: Option<(u64, u64)>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.ticket {
            self.cell.gate.lock().expect("shape gate").in_flight.remove(&key);
            self.cell.gate_changed.notify(usize::MAX);
        }
        if self.cell.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.cell.idle.notify(usize::MAX);
        }
    }
}

impl ShapeCell {
    pub fn new(shape: Shape) -> Self {
        let version = shape.version;
        Self {
            current: RwLock::new(Arc::new(shape)),
            gate: Mutex::new(Gate::default()),
            gate_changed: Event::new(),
            last_version: AtomicU64::new(version),
            paused: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle: Event::new(),
        }
    }

    pub fn load(&self) -> Arc<Shape> {
        self.current.read().expect("shape lock").clone()
    }

    /// Enters a request on `[start, start + sectors)`: waits while it touches a moving
    /// window, then returns its parts by layout. A request past the end of the shape it
    /// enters (checked against an older, larger one: the array shrank since) is refused.
    pub async fn enter(&self, start: u64, sectors: u64) -> Result<Entered<'_>, RaidError> {
        loop {
            let shape = self.load();
            let export = shape.export_sectors();
            if start.checked_add(sectors).is_none_or(|end| end > export) {
                return Err(RaidError::new(
                    ErrorKind::OutOfRange,
                    format!(
                        "request at sector {start} for {sectors} sectors is past the array's end ({export} sectors)"
                    ),
                ));
            }
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            let parts = shape.parts(start, sectors);
            let mut entered = Entered { cell: self, shape, parts, ticket: None };
            if self.paused.load(Ordering::SeqCst) {
                // Counted in first, then checked: `pause` either sees this request or it sees
                // the pause (both sequentially consistent).
                let listener = self.gate_changed.listen();
                drop(entered);
                if self.paused.load(Ordering::SeqCst) {
                    listener.await;
                }
                continue;
            }
            if entered.shape.reshape.is_none() {
                return Ok(entered);
            }
            let listener = {
                let mut gate = self.gate.lock().expect("shape gate");
                let range = start..start + sectors;
                let blocked = gate.window.as_ref().is_some_and(|w| w.start < range.end && range.start < w.end);
                if !blocked && Arc::ptr_eq(&entered.shape, &self.load()) {
                    let ticket = gate.next_ticket;
                    gate.next_ticket += 1;
                    gate.in_flight.insert((start, ticket), range.end);
                    entered.ticket = Some((start, ticket));
                    return Ok(entered);
                }
                self.gate_changed.listen()
            };
            drop(entered);
            listener.await;
        }
    }

    /// Stops new requests and waits until none is in flight (of any version): what moves the
    /// devices' data origin (a reshape starting) happens while the result is held.
    pub async fn pause(&self) -> Paused<'_> {
        let was = self.paused.swap(true, Ordering::SeqCst);
        assert!(!was, "one pause at a time");
        let paused = Paused { cell: self };
        loop {
            let listener = self.idle.listen();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return paused;
            }
            listener.await;
        }
    }

    /// Installs `next` (a higher version) and returns the shape it replaces.
    pub fn install(&self, next: Shape) -> Arc<Shape> {
        let before = self.last_version.fetch_max(next.version, Ordering::AcqRel);
        assert!(next.version > before, "shape version {} after {before}: versions only grow", next.version);
        if let (Some(old), Some(new)) = (self.load().reshape.clone(), next.reshape.as_ref())
            && Arc::ptr_eq(&old.previous, &new.previous)
        {
            let forward = new.front_sectors >= old.front_sectors;
            assert!(
                (new.direction == Direction::Forward) == forward || new.front_sectors == old.front_sectors,
                "the reshape front moved back from {} to {}",
                old.front_sectors,
                new.front_sectors
            );
        }
        let old = std::mem::replace(&mut *self.current.write().expect("shape lock"), Arc::new(next));
        self.gate_changed.notify(usize::MAX);
        old
    }

    /// A new version of the current shape: the same layouts, `reshape` as given.
    pub fn next_shape(&self, layout: Arc<Layout>, reshape: Option<Reshape>) -> Shape {
        Shape::new(self.last_version.load(Ordering::Acquire) + 1, layout, reshape)
    }

    /// Closes `window` (next to the front, on the side not yet reshaped): new requests that
    /// touch it wait, and this returns once none in flight does.
    pub async fn close_window(&self, window: Range<u64>) {
        {
            let shape = self.load();
            let r = shape.reshape.as_ref().expect("a window during a reshape");
            let at_front = match r.direction {
                Direction::Forward => window.start == r.front_sectors,
                Direction::Backward => window.end == r.front_sectors,
            };
            assert!(at_front && window.start < window.end, "window {window:?} is not at the front {}", r.front_sectors);
            let mut gate = self.gate.lock().expect("shape gate");
            assert!(gate.window.is_none(), "one window at a time");
            gate.window = Some(window.clone());
        }
        loop {
            let listener = self.gate_changed.listen();
            if !self.gate.lock().expect("shape gate").touches(&window) {
                return;
            }
            listener.await;
        }
    }

    /// Opens the window again (after the front moved over it, or the step gave up).
    pub fn open_window(&self) {
        self.gate.lock().expect("shape gate").window = None;
        self.gate_changed.notify(usize::MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    use futures::executor::block_on;

    use super::*;
    use crate::geometry::Level;

    fn raid5(disks: usize) -> Geometry {
        Geometry::new(Level::Raid5, 2, 128, &vec![128 * 64; disks]).unwrap()
    }

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    fn reshaping(front: u64) -> ShapeCell {
        let cell = ShapeCell::new(Shape::settled(Layout::settled(raid5(4))));
        let previous = cell.load().layout().clone();
        let next = cell.next_shape(
            Arc::new(Layout::new(raid5(5), 1 << 20)),
            Some(Reshape { previous, front_sectors: front, direction: Direction::Forward }),
        );
        cell.install(next);
        cell
    }

    #[test]
    fn requests_are_routed_by_the_front_and_split_at_it() {
        // Stripes: 3 x 128 sectors before, 4 x 128 after: the front is a multiple of 512.
        let cell = reshaping(1536);
        let shape = cell.load();
        assert_eq!(shape.export_sectors(), raid5(4).array_sectors());
        let e = block_on(cell.enter(0, 8)).unwrap();
        let Parts::One(p) = &e.parts else { panic!("one part") };
        assert_eq!(p.layout.geometry().raid_disks(), 5, "below the front: the new layout");
        let e2 = block_on(cell.enter(1536, 8)).unwrap();
        let Parts::One(p) = &e2.parts else { panic!("one part") };
        assert_eq!(p.layout.geometry().raid_disks(), 4, "at the front: the previous layout");
        let e3 = block_on(cell.enter(1530, 10)).unwrap();
        let Parts::Two(a, b) = &e3.parts else { panic!("split at the front") };
        assert_eq!((a.start, a.sectors, a.layout.geometry().raid_disks()), (1530, 6, 5));
        assert_eq!((b.start, b.sectors, b.layout.geometry().raid_disks()), (1536, 4, 4));
    }

    #[test]
    fn a_request_on_the_moving_window_waits_and_the_window_waits_for_requests() {
        let cell = reshaping(1536);
        let holder = block_on(cell.enter(1600, 8)).unwrap();
        let mut close = pin!(cell.close_window(1536..3072));
        assert!(poll_once(close.as_mut()).is_pending(), "a request in flight on the window holds it");
        let mut blocked = pin!(cell.enter(2000, 8));
        assert!(poll_once(blocked.as_mut()).is_pending(), "new requests on the window wait");
        let elsewhere = block_on(cell.enter(4000, 8)).unwrap();
        drop(elsewhere);
        drop(holder);
        assert!(poll_once(close.as_mut()).is_ready());
        assert!(poll_once(blocked.as_mut()).is_pending());
        let previous = cell.load().reshape().unwrap().previous.clone();
        let layout = cell.load().layout().clone();
        cell.install(
            cell.next_shape(layout, Some(Reshape { previous, front_sectors: 3072, direction: Direction::Forward })),
        );
        cell.open_window();
        let Poll::Ready(Ok(e)) = poll_once(blocked.as_mut()) else { panic!("the window opened") };
        let Parts::One(p) = &e.parts else { panic!("one part") };
        assert_eq!(p.layout.geometry().raid_disks(), 5, "moved: now in the new layout");
    }

    #[test]
    fn a_pause_waits_for_every_request_and_holds_new_ones() {
        let cell = reshaping(1536);
        let old = block_on(cell.enter(0, 8)).unwrap();
        let previous = cell.load().reshape().unwrap().previous.clone();
        let layout = cell.load().layout().clone();
        cell.install(
            cell.next_shape(layout, Some(Reshape { previous, front_sectors: 2048, direction: Direction::Forward })),
        );
        let newer = block_on(cell.enter(4000, 8)).unwrap();
        let mut pause = pin!(cell.pause());
        assert!(poll_once(pause.as_mut()).is_pending(), "requests of two versions in flight");
        drop(newer);
        assert!(poll_once(pause.as_mut()).is_pending(), "one of an older version still in flight");
        drop(old);
        let Poll::Ready(paused) = poll_once(pause.as_mut()) else { panic!("nothing in flight") };
        let mut held = pin!(cell.enter(0, 8));
        assert!(poll_once(held.as_mut()).is_pending(), "new requests wait while paused");
        drop(paused);
        assert!(poll_once(held.as_mut()).is_ready());
    }

    #[test]
    fn a_request_past_the_end_of_the_shape_it_enters_is_refused() {
        let cell = ShapeCell::new(Shape::settled(Layout::settled(raid5(4))));
        let end = cell.load().export_sectors();
        assert!(block_on(cell.enter(end - 8, 8)).is_ok());
        let smaller = Geometry::new(Level::Raid5, 2, 128, &[128 * 32; 4]).unwrap();
        cell.install(cell.next_shape(Arc::new(Layout::settled(smaller)), None));
        let refused = block_on(cell.enter(end - 8, 8)).err().expect("past the end now");
        assert_eq!(refused.kind, ErrorKind::OutOfRange);
        assert!(block_on(cell.enter(0, 8)).is_ok());
        assert_eq!(cell.in_flight.load(Ordering::SeqCst), 0, "a refused request is not counted in");
    }

    #[test]
    #[should_panic(expected = "moved back")]
    fn the_front_never_moves_back() {
        let cell = reshaping(3072);
        let previous = cell.load().reshape().unwrap().previous.clone();
        let layout = cell.load().layout().clone();
        cell.install(
            cell.next_shape(layout, Some(Reshape { previous, front_sectors: 1536, direction: Direction::Forward })),
        );
    }

    #[test]
    #[should_panic(expected = "not aligned")]
    fn a_front_inside_a_stripe_is_refused() {
        reshaping(1000);
    }

    #[test]
    #[should_panic(expected = "versions only grow")]
    fn versions_only_grow() {
        let cell = ShapeCell::new(Shape::settled(Layout::settled(raid5(4))));
        let layout = cell.load().layout().clone();
        cell.install(Shape::new(0, layout, None));
    }
}
