//! The pool of KV pages: a free list of physical page numbers.

/// Free physical pages; a page is either here, private to exactly one sequence, or a prefix-cache entry.
#[derive(Debug)]
pub(crate) struct PagePool {
    free: Vec<u32>,
    total: usize,
}

impl PagePool {
    pub(crate) fn new(num_pages: usize) -> PagePool {
        // Reversed so that pages are handed out from 0 upwards (easier to read in traces).
        PagePool { free: (0..num_pages as u32).rev().collect(), total: num_pages }
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn used_count(&self) -> usize {
        self.total - self.free.len()
    }

    pub(crate) fn total(&self) -> usize {
        self.total
    }

    pub(crate) fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub(crate) fn give_back(&mut self, pages: impl IntoIterator<Item = u32>) {
        self.free.extend(pages);
    }

    #[cfg(test)]
    pub(crate) fn free_pages(&self) -> &[u32] {
        &self.free
    }
}
