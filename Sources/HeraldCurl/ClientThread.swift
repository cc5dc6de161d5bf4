import Foundation
import HeraldCore

/// A client's thread and the requests handed to it: a FIFO of those waiting
/// for room on the wire, and a count of those taken and not yet completed.
/// Callers add from any thread; the client's thread takes and completes.
public final class ClientThread: @unchecked Sendable {  // `state` only under `lock`
    public struct Waiting: Sendable {
        public let request: CurlRequest
        public let completion: CurlClient.Completion
        /// By when it must be on the wire (`startWithin`), else answered.
        let deadline: ContinuousClock.Instant

        /// Whether the request has the whole timeout on the wire (it had to start in time) rather than what is left.
        public var timedFromStart: Bool { request.startWithin != nil }

        /// How long the request may take on the wire from `now`, or why it
        /// must not start: past its deadline it is `.notStarted` when it had
        /// to start in time, else `.timedOut`.
        public func wireTime(now: ContinuousClock.Instant) -> Result<Duration, CurlFailure> {
            let left = deadline - now
            guard left > .zero else { return .failure(timedFromStart ? .notStarted : .timedOut) }
            return .success(timedFromStart ? request.timeout : left)
        }
    }

    private struct State {
        /// `queue[head...]` waits, what is before `head` has been taken.
        var queue: [Waiting] = []
        var head = 0
        var inFlight = 0
        var stopping = false
        var waiting: Int { queue.count - head }
    }

    /// A pthread mutex rather than Synchronization.Mutex, whose futex calls
    /// ThreadSanitizer cannot see (it would report races that are not there).
    private let lock = NSLock()
    private var state = State()
    /// Wakes the client's thread; called under the lock, so that the thread
    /// can free what it wakes through once it has seen `stopping`.
    private let wake: @Sendable () -> Void
    /// Checks that the client's state is touched on its thread only.
    public let owner: ThreadOwner
    private let finished = DispatchGroup()

    public init(_ name: String, wake: @escaping @Sendable () -> Void) {
        owner = ThreadOwner(name)
        self.wake = wake
    }

    /// Starts the thread, named `name`, running `body` until `take` gives nil.
    public func start(name: String, _ body: @escaping @Sendable () -> Void) {
        finished.enter()
        Thread { [self] in
            nameCurrentThread(name)
            owner.claim()
            body()
            finished.leave()
        }.start()
    }

    private func withState<R>(_ body: (inout State) -> R) -> R {
        lock.lock()
        defer { lock.unlock() }
        return body(&state)
    }

    public var counts: (inFlight: Int, waiting: Int) { withState { ($0.inFlight, $0.waiting) } }

    /// Queues `request`, or completes it `.stopped` at once when the client has stopped.
    public func add(_ request: CurlRequest, _ completion: @escaping CurlClient.Completion) {
        let deadline = ContinuousClock.now + (request.startWithin ?? request.timeout)
        let accepted = withState { s in
            guard !s.stopping else { return false }
            s.queue.append(Waiting(request: request, completion: completion, deadline: deadline))
            wake()
            return true
        }
        if !accepted { completion(.failure(.stopped)) }
    }

    /// Marks the client stopping and waits for its thread to end, unless
    /// called on that thread (a completion that stops its own client cannot
    /// wait for the loop it runs on).
    public func stop() {
        withState { s in
            guard !s.stopping else { return }
            s.stopping = true
            wake()
        }
        if !owner.isCurrent { finished.wait() }
    }

    /// The client's thread: up to `maxInFlight` less those in flight, counted
    /// in flight from now; nil once stopping.
    public func take(maxInFlight: Int) -> [Waiting]? {
        withState { s in
            guard !s.stopping else { return nil }
            let n = min(maxInFlight - s.inFlight, s.waiting)
            guard n > 0 else { return [] }
            let taken = Array(s.queue[s.head..<s.head + n])
            s.head += n
            s.inFlight += n
            // Compacting once half is taken keeps each request's cost constant.
            if s.head * 2 >= s.queue.count { s.queue.removeFirst(s.head); s.head = 0 }
            return taken
        }
    }

    /// Whether the client's thread must go round again rather than sleep:
    /// stopping, or a waiting request has room.
    public func hasWork(maxInFlight: Int) -> Bool {
        withState { s in s.stopping || (s.waiting > 0 && s.inFlight < maxInFlight) }
    }

    /// Completes a request `take` counted in flight. Counted out first, so
    /// that a completion sees the count without itself.
    public func complete(_ completion: CurlClient.Completion, _ result: Result<CurlResponse, CurlFailure>) {
        withState { $0.inFlight -= 1 }
        completion(result)
    }

    /// After stopping: completes `.stopped` every request still waiting.
    public func stopWaiting() {
        let left = withState { s in
            defer { s.queue = []; s.head = 0 }
            return s.queue[s.head...]
        }
        for w in left { w.completion(.failure(.stopped)) }
    }
}
