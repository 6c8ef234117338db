//! The threads of one call: the calling thread and `threads - 1` helpers (the workers of
//! a pool of their own, [`HELPERS`]), spinning between ops, each op's tasks claimed from a
//! counter.
//!
//! Before this, a call ran on one of rayon's workers while the calling (Python) thread
//! slept, and that worker woke a second one. Measured per thread on 2 cores (schedstat),
//! one ~170-token passage 200 ms after the previous call: the two workers spent 10.5 ms of
//! a 39 ms call waiting on a run queue, ~11 context switches each, both placed on one core
//! until the balancer moved one; ONNX Runtime, whose calling thread works beside one woken
//! worker, waited 0.3 ms. Here the calling thread does the work and wakes `threads - 1`
//! helpers, as ONNX Runtime's pool does: the one running thread never waits for a second
//! to be scheduled beside it.
//!
//! Within [`with_team`], [`claim_tasks`] publishes an op to the helpers; outside one it runs
//! the tasks on the calling thread (a text of a few tokens, whose ops are too small to
//! split: see `packed::SERIAL_FMAS`).

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The body of an op: runs task `i`.
type Body<'a> = dyn Fn(usize) + Sync + 'a;

/// Spins of a waiting thread before it also yields its core on each turn, so that a
/// preempted thread it waits for (or another call's) gets the core back.
const SPINS_BEFORE_YIELD: u32 = 1 << 12;

/// What the calling thread and its helpers share for the length of one call.
///
/// The protocol: `epoch` is odd while no op is open. The caller writes `body`, `tasks` and
/// `next` only then, and opens an op by storing the next even `epoch`. A helper that sees a
/// new even epoch counts itself in `busy`, checks the epoch again and only then reads the
/// op; it counts itself out when the op has no task left to claim. The caller, when it has
/// no task left to claim either, closes the op (odd epoch) and waits for `busy == 0` before
/// returning, so no helper still holds the op's body, which lives on the caller's stack.
struct Shared {
    epoch: AtomicUsize,
    busy: AtomicUsize,
    next: AtomicUsize,
    tasks: AtomicUsize,
    /// The open op's body, its lifetime erased (see the protocol above).
    body: UnsafeCell<Option<*const Body<'static>>>,
    stop: AtomicBool,
    /// The first panic of a helper, raised again on the calling thread.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `body` is written and read only as the protocol on `Shared` says; every other
// field is atomic or locked.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

thread_local! {
    /// The team this thread leads, while it runs [`with_team`]'s closure.
    static TEAM: Cell<Option<*const Shared>> = const { Cell::new(None) };
}

/// The helpers' own pool: `threads - 1` workers, beside rayon's global pool of `threads`
/// (whose size sets the team's). Helpers are not jobs on the global pool: there, with calls
/// back to back, a second worker wakes for a helper job that the first, still idle from the
/// last call, takes, and spins beside the call. schedstat, 32 ~170-token
/// passages back to back on 2 cores: a third thread ran 55-133 ms and waited ~500 ms
/// runnable, and the block took ~10% longer than the same calls 50 ms apart. With a pool of
/// exactly the helpers, the job always goes to the worker that ran the last one.
static HELPERS: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

/// The helpers' pool for a team of `threads` (`None` if it could not be built: then the
/// global pool runs them).
fn helpers(threads: usize) -> Option<&'static rayon::ThreadPool> {
    HELPERS
        .get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads - 1)
                .thread_name(|i| format!("embedder-helper-{i}"))
                .build()
                .ok()
        })
        .as_ref()
}

/// A spin-then-yield wait, until `done()`.
fn wait_until(mut done: impl FnMut() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < SPINS_BEFORE_YIELD {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Shared {
    /// Runs the open op's tasks until none is left to claim.
    fn drain(&self, body: &Body<'_>) {
        let tasks = self.tasks.load(Ordering::Relaxed);
        loop {
            let task = self.next.fetch_add(1, Ordering::Relaxed);
            if task >= tasks {
                break;
            }
            body(task);
        }
    }

    /// A helper's life: join each op as it opens, until the call ends.
    fn help(&self) {
        let mut seen = 1;
        loop {
            // the next op this helper has not joined yet, or the end of the call
            let mut epoch = seen;
            wait_until(|| {
                epoch = self.epoch.load(Ordering::Acquire);
                (epoch % 2 == 0 && epoch != seen) || self.stop.load(Ordering::Acquire)
            });
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            self.busy.fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == epoch {
                seen = epoch;
                // SAFETY: the op `epoch` is open and this helper is counted in `busy`, so
                // the caller neither rewrites `body` nor leaves the op until it is out.
                let body = unsafe { &*(*self.body.get()).expect("an open op has a body") };
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.drain(body))) {
                    let mut first = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert(panic);
                }
            }
            self.busy.fetch_sub(1, Ordering::Release);
        }
    }

    /// Runs `body(0..tasks)` on the calling thread and the helpers.
    fn run(&self, tasks: usize, body: &Body<'_>) {
        /// Closes the op and waits out the helpers inside it, however the caller's share
        /// of the tasks ends.
        struct Close<'a>(&'a Shared, usize);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                self.0.epoch.store(self.1 + 1, Ordering::SeqCst);
                wait_until(|| self.0.busy.load(Ordering::SeqCst) == 0);
            }
        }
        let epoch = self.epoch.load(Ordering::Relaxed) + 1;
        // SAFETY: no op is open (odd epoch) and `busy == 0` since the last one closed, so
        // no helper reads `body`; `Close` keeps the erased borrow from outliving `body`.
        unsafe {
            let erased: *const Body<'static> = std::mem::transmute(body as *const Body<'_>);
            *self.body.get() = Some(erased);
        }
        self.tasks.store(tasks, Ordering::Relaxed);
        self.next.store(0, Ordering::Relaxed);
        self.epoch.store(epoch, Ordering::Release);
        {
            let _close = Close(self, epoch);
            self.drain(body);
        }
        let panic = self.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(panic) = panic {
            resume_unwind(panic);
        }
    }
}

/// Runs `f` on the calling thread with `threads - 1` helpers (`threads`: rayon's global
/// pool size; the helpers are the workers of their own pool, [`HELPERS`]), when `wanted`:
/// every [`claim_tasks`] inside `f` on this thread is shared with them. Helpers spin between ops (a call's ops follow each other within
/// microseconds) and leave when `f` returns; one that starts only after that leaves at once,
/// and the caller does not wait for it.
pub(crate) fn with_team<R>(wanted: bool, f: impl FnOnce() -> R) -> R {
    let threads = rayon::current_num_threads();
    if !wanted || threads < 2 || TEAM.with(Cell::get).is_some() {
        return f();
    }
    let shared = Arc::new(Shared {
        epoch: AtomicUsize::new(1),
        busy: AtomicUsize::new(0),
        next: AtomicUsize::new(0),
        tasks: AtomicUsize::new(0),
        body: UnsafeCell::new(None),
        stop: AtomicBool::new(false),
        panic: Mutex::new(None),
    });
    let pool = helpers(threads);
    for _ in 1..threads {
        let shared = Arc::clone(&shared);
        match pool {
            Some(pool) => pool.spawn(move || shared.help()),
            None => rayon::spawn(move || shared.help()),
        }
    }
    /// Ends the call for the helpers and for this thread, however `f` ends.
    struct Leave<'a>(&'a Shared);
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            self.0.stop.store(true, Ordering::Release);
            TEAM.with(|t| t.set(None));
        }
    }
    TEAM.with(|t| t.set(Some(Arc::as_ptr(&shared))));
    let _leave = Leave(&shared);
    f()
}

/// Runs `run(0..tasks)`: shared with the team this thread leads (each thread claims the next
/// task from a counter just before it runs it, so one preempted thread holds up at most the
/// one task it is running), or on this thread alone outside [`with_team`].
pub(crate) fn claim_tasks(tasks: usize, run: impl Fn(usize) + Sync) {
    match TEAM.with(Cell::get) {
        // SAFETY: the pointer is set only while `with_team` holds the `Arc` on this thread.
        Some(shared) if tasks > 1 => unsafe { &*shared }.run(tasks, &run),
        _ => (0..tasks).for_each(run),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Every task runs exactly once, op after op, and the helpers take a share. Other
    /// tests' calls share the helpers' pool, and a helper busy with one of them joins this
    /// call only when that one ends: the call is repeated (up to 100 times) until one did.
    #[test]
    fn every_task_runs_once_and_helpers_share() {
        let threads = rayon::current_num_threads();
        let caller = std::thread::current().id();
        let on_helpers = AtomicUsize::new(0);
        for _ in 0..100 {
            with_team(true, || {
                for op in 0..60usize {
                    let tasks = 1 + op % 37;
                    let hits: Vec<AtomicU64> = (0..tasks).map(|_| AtomicU64::new(0)).collect();
                    claim_tasks(tasks, |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                        if std::thread::current().id() != caller {
                            on_helpers.fetch_add(1, Ordering::Relaxed);
                        }
                        // long enough that a helper gets to claim some
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    });
                    assert!(
                        hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                        "op {op}"
                    );
                }
            });
            if threads < 2 || on_helpers.load(Ordering::Relaxed) > 0 {
                break;
            }
        }
        if threads > 1 {
            assert!(
                on_helpers.load(Ordering::Relaxed) > 0,
                "no helper ran a task"
            );
        }
    }

    /// The helpers are the workers of their own pool, one fewer than rayon's global pool,
    /// and a call's tasks off the calling thread run there (not on the global pool).
    #[test]
    fn helpers_have_their_own_pool() {
        let threads = rayon::current_num_threads();
        if threads < 2 {
            return;
        }
        let pool = helpers(threads).expect("the helpers' pool builds");
        assert_eq!(pool.current_num_threads(), threads - 1);
        let caller = std::thread::current().id();
        let elsewhere = Mutex::new(Vec::new());
        for _ in 0..100 {
            with_team(true, || {
                claim_tasks(64, |_| {
                    if std::thread::current().id() != caller {
                        let name = std::thread::current().name().map(str::to_owned);
                        elsewhere.lock().unwrap().push(name.unwrap_or_default());
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50));
                })
            });
            if !elsewhere.lock().unwrap().is_empty() {
                break;
            }
        }
        let names = elsewhere.into_inner().unwrap();
        assert!(!names.is_empty(), "no helper ran a task");
        assert!(
            names.iter().all(|n| n.starts_with("embedder-helper-")),
            "{names:?}"
        );
    }

    /// Outside a team, or with it not wanted, the tasks run on the calling thread.
    #[test]
    fn without_a_team_tasks_run_on_the_caller() {
        let caller = std::thread::current().id();
        for in_unwanted_team in [false, true] {
            let elsewhere = AtomicUsize::new(0);
            let count = |_: usize| {
                if std::thread::current().id() != caller {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
            };
            if in_unwanted_team {
                with_team(false, || claim_tasks(64, count));
            } else {
                claim_tasks(64, count);
            }
            assert_eq!(elsewhere.load(Ordering::Relaxed), 0);
        }
    }

    /// A panic in any task reaches the caller, and the next call still works.
    #[test]
    fn a_panicking_task_panics_the_call() {
        for bad in [0usize, 63] {
            let result = catch_unwind(|| {
                with_team(true, || {
                    claim_tasks(64, |i| {
                        std::thread::sleep(std::time::Duration::from_micros(20));
                        assert!(i != bad, "task {i} fails");
                    })
                })
            });
            assert!(result.is_err(), "task {bad}'s panic was lost");
            assert!(TEAM.with(Cell::get).is_none(), "the team outlived its call");
        }
        let sum = AtomicUsize::new(0);
        with_team(true, || {
            claim_tasks(100, |i| {
                sum.fetch_add(i, Ordering::Relaxed);
            })
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }
}
