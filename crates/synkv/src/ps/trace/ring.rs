//! [`Ring`]: a bounded buffer that keeps the last `capacity` items pushed, overwriting the
//! oldest. Pushing never allocates once the buffer has grown to its capacity (the flight
//! recorder's ring is allocated whole when recording starts; a trace ring grows as it fills).

/// The last `capacity` items pushed, oldest first.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    buf: Vec<T>,
    capacity: usize,
    /// Where the next item goes once the buffer is full (the oldest item).
    next: usize,
    /// Items ever pushed (kept or overwritten).
    total: u64,
}

impl<T> Ring<T> {
    /// An empty ring of capacity 0 (records nothing).
    pub(crate) const fn empty() -> Ring<T> {
        Ring { buf: Vec::new(), capacity: 0, next: 0, total: 0 }
    }

    /// An empty ring that keeps `capacity` items, with room for `reserve` of them allocated now.
    pub(crate) fn with_capacity(capacity: usize, reserve: usize) -> Ring<T> {
        Ring { buf: Vec::with_capacity(reserve.min(capacity)), capacity, next: 0, total: 0 }
    }

    /// Adds `item`, dropping the oldest one when the ring is full; a ring of capacity 0
    /// drops `item`.
    pub(crate) fn push(&mut self, item: T) {
        self.total += 1;
        if self.capacity == 0 {
            return;
        }
        if self.buf.len() < self.capacity {
            self.buf.push(item);
        } else {
            self.buf[self.next] = item;
            self.next = (self.next + 1) % self.capacity;
        }
    }

    /// The items kept, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        let (newer, older) = self.buf.split_at(self.next);
        older.iter().chain(newer)
    }

    /// Items it keeps at most.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Items kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Items pushed but no longer kept (overwritten, or pushed into a ring of capacity 0).
    pub(crate) fn dropped(&self) -> u64 {
        self.total - self.buf.len() as u64
    }

    /// Forgets every item (the allocation is kept).
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.next = 0;
        self.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(r: &Ring<u32>) -> Vec<u32> {
        r.iter().copied().collect()
    }

    #[test]
    fn keeps_the_last_items_oldest_first_and_never_grows_past_its_capacity() {
        let mut r = Ring::with_capacity(3, 3);
        assert!(items(&r).is_empty());
        r.push(1);
        r.push(2);
        assert_eq!(items(&r), [1, 2]);
        for i in 3..=10 {
            r.push(i);
            assert!(r.len() <= 3);
        }
        assert_eq!(items(&r), [8, 9, 10]);
        assert_eq!((r.len(), r.dropped()), (3, 7));
        assert_eq!(r.buf.capacity(), 3, "no reallocation once full");
        r.clear();
        assert!(items(&r).is_empty());
        r.push(11);
        assert_eq!(items(&r), [11]);
    }

    #[test]
    fn a_ring_of_capacity_zero_keeps_nothing() {
        let mut r: Ring<u32> = Ring::empty();
        r.push(1);
        r.push(2);
        assert_eq!((r.len(), r.dropped()), (0, 2));
        assert!(items(&r).is_empty());
    }

    #[test]
    fn a_ring_grows_to_its_capacity_from_a_small_reservation() {
        let mut r = Ring::with_capacity(5, 1);
        (0..12).for_each(|i| r.push(i));
        assert_eq!(items(&r), [7, 8, 9, 10, 11]);
    }
}
