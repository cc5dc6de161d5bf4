import CCurl
import Foundation
import HeraldCore

/// The thread behind a `CurlClient`: one curl multi handle, driven by
/// curl_multi_poll / perform / info_read. Requests come in from any thread
/// through `shared` and a curl_multi_wakeup (which curl makes thread-safe).
final class CurlLoop: @unchecked Sendable {  // `shared` only under `lock`; `multi`, `running` and `idle` only on the loop thread (`owner` checks it)
    private struct Waiting {
        let request: CurlRequest
        let completion: CurlClient.Completion
        /// By when it must be on the wire (`startWithin`), else answered.
        let deadline: ContinuousClock.Instant
    }

    private struct Shared {
        /// A FIFO: `queue[head...]` waits, what is before `head` has been taken.
        var queue: [Waiting] = []
        var head = 0
        /// Taken from the queue and not yet completed.
        var inFlight = 0
        var stopping = false

        var waiting: Int { queue.count - head }

        mutating func take(_ n: Int) -> [Waiting] {
            let taken = Array(queue[head..<head + n])
            head += n
            inFlight += n
            // Compacting once half is taken keeps each request's cost constant.
            if head * 2 >= queue.count { queue.removeFirst(head); head = 0 }
            return taken
        }
    }

    private let multi: UnsafeMutableRawPointer
    private let caFile: String?
    private let http2: Bool
    private let plainHTTP: Bool
    private let maxInFlight: Int
    private let maxResponseBytes: Int
    private let idleSeconds: Int
    /// A pthread mutex rather than Synchronization.Mutex, whose futex calls
    /// ThreadSanitizer cannot see (it would report races that are not there).
    private let lock = NSLock()
    private var shared = Shared()
    private let owner = ThreadOwner("curl loop")
    private let finished = DispatchGroup()
    private var running: [UnsafeMutableRawPointer: CurlTransfer] = [:]
    /// Handles whose request ended, for the next ones: at most `idleKept`.
    private var idle: [CurlTransfer] = []
    /// Enough for a steady flow; a burst of a push client's 1,000 in flight
    /// would otherwise keep 1,000 handles (some 20 KB each: curl's buffers) for good.
    private static let idleKept = 64

    private static let globalInit: Void = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()

    init(caFile: String?, http2: Bool, maxInFlight: Int, maxResponseBytes: Int, idleSeconds: Int, plainHTTP: Bool) throws {
        _ = Self.globalInit
        guard let m = curl_multi_init() else { throw CurlFailure.other("curl_multi_init failed") }
        let codes = [
            herald_multi_setopt_long(m, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX)),
            // HTTP/2: every stream on one connection per host, as APNs asks.
            // HTTP/1.1 carries one request at a time per connection: one per request in flight.
            herald_multi_setopt_long(m, CURLMOPT_MAX_HOST_CONNECTIONS, http2 ? 1 : maxInFlight),
            herald_multi_setopt_long(m, CURLMOPT_MAX_CONCURRENT_STREAMS, maxInFlight),
        ]
        if let bad = codes.first(where: { $0 != CURLM_OK }) {
            curl_multi_cleanup(m)
            throw CurlFailure.other("curl_multi_setopt: " + String(cString: curl_multi_strerror(bad)))
        }
        multi = m
        self.caFile = caFile; self.http2 = http2; self.plainHTTP = plainHTTP; self.maxInFlight = maxInFlight; self.maxResponseBytes = maxResponseBytes
        self.idleSeconds = idleSeconds
    }

    func start(name: String) {
        finished.enter()
        Thread { [self] in
            nameCurrentThread(name)
            owner.claim()
            run()
        }.start()
    }

    private func withShared<R>(_ body: (inout Shared) -> R) -> R {
        lock.lock()
        defer { lock.unlock() }
        return body(&shared)
    }

    var counts: (inFlight: Int, waiting: Int) { withShared { ($0.inFlight, $0.waiting) } }

    func send(_ request: CurlRequest, _ completion: @escaping CurlClient.Completion) {
        let deadline = ContinuousClock.now + (request.startWithin ?? request.timeout)
        let accepted = withShared { s in
            guard !s.stopping else { return false }
            s.queue.append(Waiting(request: request, completion: completion, deadline: deadline))
            // Under the lock: the loop frees `multi` only after it saw `stopping`.
            curl_multi_wakeup(multi)
            return true
        }
        if !accepted { completion(.failure(.stopped)) }
    }

    func stop() {
        withShared { s in
            guard !s.stopping else { return }
            s.stopping = true
            curl_multi_wakeup(multi)
        }
        // A completion that stops its own client cannot wait for the loop it runs on.
        if !owner.isCurrent { finished.wait() }
    }

    // MARK: The loop thread

    private func run() {
        var active: Int32 = 0
        while true {
            let (batch, stop) = withShared { s in
                s.stopping ? ([], true) : (s.take(min(maxInFlight - s.inFlight, s.waiting)), false)
            }
            if stop { break }
            for w in batch { begin(w) }
            curl_multi_perform(multi, &active)
            collect()
            // Sleep only when no waiting request can start: a slot freed above
            // must not wait for the poll's timeout. That timeout is short because
            // curl 7.88 can leave an HTTP/2 header block larger than its 16 KiB
            // receive buffer half read with no timer set: such an answer moves
            // on only at the next timeout.
            let more = withShared { s in s.stopping || (s.waiting > 0 && s.inFlight < maxInFlight) }
            if !more { curl_multi_poll(multi, nil, 0, 1000, nil) }
        }
        finish()
    }

    /// Completes a request that `take` counted in flight. Counted out first,
    /// so that a completion sees the count without itself.
    private func complete(_ completion: CurlClient.Completion, _ result: Result<CurlResponse, CurlFailure>) {
        withShared { $0.inFlight -= 1 }
        completion(result)
    }

    /// Hands `w` to curl, or completes it when it cannot go.
    private func begin(_ w: Waiting) {
        owner.preconditionCurrent()
        let left = w.deadline - .now
        // With `startWithin` the deadline is the start's, and the wire has the whole timeout.
        let mustStart = w.request.startWithin != nil
        guard left > .zero else { return complete(w.completion, .failure(mustStart ? .notStarted : .timedOut)) }
        guard let t = idle.popLast()
                ?? CurlTransfer(limit: maxResponseBytes, caFile: caFile, http2: http2, idleSeconds: idleSeconds, plainHTTP: plainHTTP) else {
            return complete(w.completion, .failure(.other("curl_easy_init or curl_easy_setopt failed")))
        }
        if let failure = t.configure(w.request, timeout: mustStart ? w.request.timeout : left, plainHTTP: plainHTTP, completion: w.completion) {
            return complete(w.completion, .failure(failure))
        }
        let code = curl_multi_add_handle(multi, t.easy)
        guard code == CURLM_OK else {
            return complete(w.completion, .failure(.other("curl_multi_add_handle: " + String(cString: curl_multi_strerror(code)))))
        }
        running[t.easy] = t
    }

    /// Completes the transfers that ended.
    private func collect() {
        owner.preconditionCurrent()
        var left: Int32 = 0
        while let m = curl_multi_info_read(multi, &left) {
            guard m.pointee.msg == CURLMSG_DONE, let easy = m.pointee.easy_handle, let t = running.removeValue(forKey: easy) else { continue }
            // Read before the removal, which ends the message's life.
            let result = t.result(m.pointee.data.result)
            curl_multi_remove_handle(multi, easy)
            let completion = t.completion!
            t.reset()
            if idle.count < min(maxInFlight, Self.idleKept) { idle.append(t) }
            complete(completion, result)
        }
    }

    private func finish() {
        owner.preconditionCurrent()
        for t in running.values {
            curl_multi_remove_handle(multi, t.easy)
            complete(t.completion!, .failure(.stopped))
        }
        running.removeAll()
        idle.removeAll()
        let left = withShared { s in
            defer { s.queue = []; s.head = 0 }
            return s.queue[s.head...]
        }
        for w in left { w.completion(.failure(.stopped)) }
        curl_multi_cleanup(multi)
        finished.leave()
    }
}
