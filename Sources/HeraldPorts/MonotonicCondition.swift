import Foundation

/// A mutex and condition whose timed waits run on CLOCK_MONOTONIC.
/// NSCondition's `wait(until:)` waits for a wall-clock date, so a system
/// clock set back an hour stretched a 100 ms wait (the engine's, between
/// its maintenance runs) to an hour.
public final class MonotonicCondition: @unchecked Sendable {  // pthread objects, touched only through pthread calls
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let cond = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    /// A point on the monotonic clock.
    public struct Deadline: Sendable {
        fileprivate let time: timespec

        public static func seconds(fromNow s: Double) -> Deadline {
            var t = timespec()
            clock_gettime(CLOCK_MONOTONIC, &t)
            let ns = Int(t.tv_nsec) + Int(s * 1e9)
            t.tv_sec += ns / 1_000_000_000
            t.tv_nsec = ns % 1_000_000_000
            return Deadline(time: t)
        }
    }

    public init() {
        pthread_mutex_init(mutex, nil)
        var attr = pthread_condattr_t()
        pthread_condattr_init(&attr)
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(cond, &attr)
        pthread_condattr_destroy(&attr)
    }

    deinit {
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        cond.deallocate()
        mutex.deallocate()
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }

    public func withLock<R>(_ body: () throws -> R) rethrows -> R {
        lock()
        defer { unlock() }
        return try body()
    }

    /// With the lock held: waits for a signal.
    public func wait() { pthread_cond_wait(cond, mutex) }

    /// With the lock held: waits for a signal until `deadline`; false once
    /// it has passed.
    @discardableResult public func wait(until deadline: Deadline) -> Bool {
        var t = deadline.time
        return pthread_cond_timedwait(cond, mutex, &t) == 0
    }

    public func signal() { pthread_cond_signal(cond) }
    public func broadcast() { pthread_cond_broadcast(cond) }
}
