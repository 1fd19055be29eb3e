//! Events: points in a stream that other streams can wait for, that the host can wait for,
//! and that time the work between them.
//!
//! On the CPU device every operation has finished when it returns, so an event is complete as
//! soon as it is recorded, waiting on one does nothing, and the time between two events is the
//! host time between their recordings (what the work recorded between them took).

use std::time::Instant;

use cudarc::driver::{sys, CudaEvent};

use crate::cuda::describe;
use crate::device::Device;
use crate::error::{Result, RuntimeError};
use crate::stream::Stream;

/// A recorded point in a stream ([`Stream::record_event`]).
pub struct Event {
    device: Device,
    kind: EventKind,
}

enum EventKind {
    Host(Instant),
    Cuda(CudaEvent),
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event(on {})", self.device)
    }
}

impl Stream {
    /// Record an event after all work queued on this stream so far (with timing enabled).
    pub fn record_event(&self) -> Result<Event> {
        let kind = match self.cuda() {
            None => EventKind::Host(Instant::now()),
            Some(s) => EventKind::Cuda(s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| {
                RuntimeError::driver(format!("recording an event on a stream of {}", self.device()), describe(e))
            })?),
        };
        Ok(Event { device: self.device().clone(), kind })
    }

    /// Make work queued on this stream from now on wait until `event` has completed, without
    /// blocking the host. An event of another device is an error.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match (self.cuda(), &event.kind) {
            (None, EventKind::Host(_)) => Ok(()),
            (Some(s), EventKind::Cuda(e)) if self.device().same_device(&event.device) => s
                .wait(e)
                .map_err(|e| RuntimeError::driver(format!("waiting for an event on {}", self.device()), describe(e))),
            _ => Err(RuntimeError::DeviceMismatch {
                op: "Stream::wait_event".into(),
                message: format!("the event is on {}, the stream on {}", event.device, self.device()),
            }),
        }
    }
}

impl Event {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Block the host until the work before the event has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.device.forbid_in_capture(|| format!("waiting for an event on {}", self.device))?;
        self.device.counters_core().host_sync();
        match &self.kind {
            EventKind::Host(_) => Ok(()),
            EventKind::Cuda(e) => e.synchronize().map_err(|e| {
                RuntimeError::driver(
                    format!("waiting for an event on {} (an earlier kernel may have failed)", self.device),
                    describe(e),
                )
            }),
        }
    }

    /// Whether the work before the event has finished, without waiting.
    pub fn is_complete(&self) -> Result<bool> {
        match &self.kind {
            EventKind::Host(_) => Ok(true),
            EventKind::Cuda(e) => e
                .try_is_complete()
                .map_err(|e| RuntimeError::driver(format!("querying an event on {}", self.device), describe(e))),
        }
    }

    /// Milliseconds from this event to `end` (waiting for both). Both must be on one device;
    /// `end` recorded earlier gives a negative time.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f64> {
        self.device.forbid_in_capture(|| format!("timing two events on {}", self.device))?;
        self.device.counters_core().host_sync();
        match (&self.kind, &end.kind) {
            (EventKind::Host(a), EventKind::Host(b)) => Ok(match b.checked_duration_since(*a) {
                Some(d) => d.as_secs_f64() * 1e3,
                None => -(a.duration_since(*b).as_secs_f64() * 1e3),
            }),
            (EventKind::Cuda(a), EventKind::Cuda(b)) if self.device.same_device(&end.device) => a
                .elapsed_ms(b)
                .map(f64::from)
                .map_err(|e| RuntimeError::driver(format!("timing two events on {}", self.device), describe(e))),
            _ => Err(RuntimeError::DeviceMismatch {
                op: "Event::elapsed_ms".into(),
                message: format!("the events are on {} and {}", self.device, end.device),
            }),
        }
    }
}
