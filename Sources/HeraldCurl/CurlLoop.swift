import CCurl
import Foundation
import HeraldCore

/// The thread behind a `CurlClient`: one curl multi handle, driven by
/// curl_multi_poll / perform / info_read. Requests come in from any thread
/// through `thread` and a curl_multi_wakeup (which curl makes thread-safe).
final class CurlLoop: @unchecked Sendable {  // `multi` is freed only after `thread` stopped; `running` and `idle` only on the loop thread (`owner` checks it)
    private let multi: UnsafeMutableRawPointer
    private let caFile: String?
    private let http2: Bool
    private let plainHTTP: Bool
    private let maxInFlight: Int
    private let maxResponseBytes: Int
    private let idleSeconds: Int
    let thread: ClientThread
    private var owner: ThreadOwner { thread.owner }
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
        // Under the thread's lock: the loop frees `multi` only after it saw it stopping.
        nonisolated(unsafe) let wakeable = m
        thread = ClientThread("curl loop") { curl_multi_wakeup(wakeable) }
        self.caFile = caFile; self.http2 = http2; self.plainHTTP = plainHTTP; self.maxInFlight = maxInFlight; self.maxResponseBytes = maxResponseBytes
        self.idleSeconds = idleSeconds
    }

    func start(name: String) { thread.start(name: name) { [self] in run() } }

    // MARK: The loop thread

    private func run() {
        var active: Int32 = 0
        while true {
            guard let batch = thread.take(maxInFlight: maxInFlight) else { break }
            for w in batch { begin(w) }
            curl_multi_perform(multi, &active)
            collect()
            // Sleep only when no waiting request can start: a slot freed above
            // must not wait for the poll's timeout. That timeout is short because
            // curl 7.88 can leave an HTTP/2 header block larger than its 16 KiB
            // receive buffer half read with no timer set: such an answer moves
            // on only at the next timeout.
            if !thread.hasWork(maxInFlight: maxInFlight) { curl_multi_poll(multi, nil, 0, 1000, nil) }
        }
        finish()
    }

    /// Hands `w` to curl, or completes it when it cannot go.
    private func begin(_ w: ClientThread.Waiting) {
        owner.preconditionCurrent()
        let timeout: Duration
        switch w.wireTime(now: .now) {
        case .success(let t): timeout = t
        case .failure(let f): return complete(w.completion, .failure(f))
        }
        guard let t = idle.popLast()
                ?? CurlTransfer(limit: maxResponseBytes, caFile: caFile, http2: http2, idleSeconds: idleSeconds, plainHTTP: plainHTTP) else {
            return complete(w.completion, .failure(.other("curl_easy_init or curl_easy_setopt failed")))
        }
        if let failure = t.configure(w.request, timeout: timeout, plainHTTP: plainHTTP, completion: w.completion) {
            return complete(w.completion, .failure(failure))
        }
        let code = curl_multi_add_handle(multi, t.easy)
        guard code == CURLM_OK else {
            return complete(w.completion, .failure(.other("curl_multi_add_handle: " + String(cString: curl_multi_strerror(code)))))
        }
        running[t.easy] = t
    }

    private func complete(_ completion: CurlClient.Completion, _ result: Result<CurlResponse, CurlFailure>) {
        thread.complete(completion, result)
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
        thread.stopWaiting()
        curl_multi_cleanup(multi)
    }
}
