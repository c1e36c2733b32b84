//! A future that handles its own wake-ups while it is being polled.
//!
//! The batching task polls, in one poll, the connection it drives and the
//! calls it has made on it; a call handing its request to the connection
//! wakes the task, and so does a reply completing a call. tokio treats a
//! task woken while it runs as one that yielded: it goes to the back of the
//! worker's queue and another worker is woken (a futex or eventfd write) to
//! steal it, which it then finds nothing to do for. At one operation at a
//! time that was two to three cross-thread wake-ups per call. [`Repoll`]
//! gives the inner future a waker of its own: a wake during the poll only
//! marks the poll to be run again at once; a wake at any other time goes to
//! the task as usual. The batching task's loop polls everything it waits
//! on at its top, and forgets the wakes so far there ([`Wakes::forget`]):
//! otherwise each call's own hand-over to the connection and each reply
//! made the poll run once more and find nothing (two extra rounds of the
//! loop per operation at one operation at a time).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Polls again at most this many times in a row before yielding to the
/// scheduler, so that a future that keeps waking itself (a spent `coop`
/// budget does) cannot starve the worker's other tasks.
const MAX_REPOLLS: usize = 4;

const POLLING: u8 = 1;
const WOKEN: u8 = 2;

/// `future`, polled again at once when it wakes itself during a poll.
pub(super) struct Repoll<F> {
    future: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
}

struct Signal {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.fetch_or(WOKEN, Ordering::AcqRel) & POLLING == 0 {
            self.task.wake();
        }
    }
}

impl<F: Future> Repoll<F> {
    #[cfg(test)]
    fn new(future: F) -> Self {
        Self::with(|_| future)
    }

    /// The future `make` returns, given a handle that lets it forget the
    /// wakes it has had so far ([`Wakes::forget`]).
    pub(super) fn with(make: impl FnOnce(Wakes) -> F) -> Self {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(0),
            task: AtomicWaker::new(),
        });
        let future = make(Wakes(signal.clone()));
        Self {
            future: Box::pin(future),
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

/// The wakes a [`Repoll`]'s future has had during the current poll.
pub(super) struct Wakes(Arc<Signal>);

impl Wakes {
    /// Forgets them, so that they do not make the poll run again: for a
    /// future about to poll everything it waits on, which answers every
    /// wake so far (a loop around a `select!`, at its top). A wake from
    /// then on still counts.
    pub(super) fn forget(&self) {
        self.0.state.fetch_and(!WOKEN, Ordering::AcqRel);
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.signal.task.register(cx.waker());
        let mut inner = Context::from_waker(&this.waker);
        for _ in 0..MAX_REPOLLS {
            this.signal.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(output) = this.future.as_mut().poll(&mut inner) {
                this.signal.state.store(0, Ordering::Release);
                return Poll::Ready(output);
            }
            // Not woken while polling: any later wake goes to the task.
            if this
                .signal
                .state
                .compare_exchange(POLLING, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Poll::Pending;
            }
        }
        this.signal.state.store(0, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// Counts the wake-ups the scheduler would get.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll_once<F: Future>(future: &mut Repoll<F>, count: &Arc<Count>) -> Poll<F::Output> {
        let waker = Waker::from(count.clone());
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    /// A future that wakes itself on each of its first `wakes` polls.
    fn waking_itself(wakes: usize) -> impl Future<Output = usize> {
        let mut polls = 0;
        std::future::poll_fn(move |cx| {
            polls += 1;
            if polls <= wakes {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(polls)
            }
        })
    }

    #[test]
    fn a_wake_during_the_poll_is_a_poll_again_not_a_reschedule() {
        let count = Arc::new(Count::default());
        let mut future = Repoll::new(waking_itself(2));
        assert_eq!(poll_once(&mut future, &count), Poll::Ready(3));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_the_scheduler() {
        let count = Arc::new(Count::default());
        let mut future = Repoll::new(waking_itself(usize::MAX));
        assert_eq!(poll_once(&mut future, &count), Poll::Pending);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "woken to run again later"
        );
    }

    #[test]
    fn forgotten_wakes_do_not_poll_again_and_later_ones_do() {
        let count = Arc::new(Count::default());
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = polls.clone();
        let mut future = Repoll::with(|wakes| {
            std::future::poll_fn(move |cx| {
                let poll = seen.fetch_add(1, Ordering::SeqCst);
                cx.waker().wake_by_ref();
                if poll == 0 {
                    // Everything is about to be polled again: this wake
                    // is answered, the next one is not.
                    wakes.forget();
                    cx.waker().wake_by_ref();
                    wakes.forget();
                }
                Poll::<()>::Pending
            })
        });
        assert_eq!(poll_once(&mut future, &count), Poll::Pending);
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the wakes were forgotten");
        assert_eq!(poll_once(&mut future, &count), Poll::Pending);
        assert_eq!(
            polls.load(Ordering::SeqCst),
            2 + MAX_REPOLLS - 1,
            "a wake not forgotten polls again"
        );
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "then yields");
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        let count = Arc::new(Count::default());
        let stored: Arc<Mutex<Option<Waker>>> = Arc::default();
        let keep = stored.clone();
        let mut future = Repoll::new(std::future::poll_fn(move |cx| {
            *keep.lock().unwrap() = Some(cx.waker().clone());
            Poll::<()>::Pending
        }));
        assert_eq!(poll_once(&mut future, &count), Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        stored.lock().unwrap().take().unwrap().wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
