import CCurl
import Foundation

/// One HTTP request to a push service.
public struct CurlRequest: Sendable {
    public var method: String
    public var url: String
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// The whole request, connecting included.
    public var timeout: Duration

    public init(method: String, url: String, headers: [(String, String)], body: [UInt8], timeout: Duration) {
        self.method = method; self.url = url; self.headers = headers; self.body = body; self.timeout = timeout
    }
}

public struct CurlResponse: Sendable {
    public let status: Int
    /// Lower-cased names; of a repeated header, the last.
    public let headers: [String: String]
    public let body: [UInt8]
    /// 1 or 2.
    public let httpVersion: Int
}

public enum CurlFailure: Error, Sendable, Equatable, CustomStringConvertible {
    case timedOut
    case connect(String)
    case tls(String)
    /// Never sent: not `https`, or a malformed URL.
    case refused(String)
    /// The answer was longer than the client takes.
    case tooLarge
    /// The client stopped with the request in flight.
    case stopped
    case other(String)

    public var description: String {
        switch self {
        case .timedOut: "timed out"
        case .connect(let m): "could not connect: \(m)"
        case .tls(let m): "TLS: \(m)"
        case .refused(let m): "refused: \(m)"
        case .tooLarge: "answer too large"
        case .stopped: "client stopped"
        case .other(let m): m
        }
    }
}

/// An HTTP client for the push services on a thread of its own, over
/// libcurl's multi interface: HTTP/2 streams multiplexed on one connection
/// per host (APNs wants exactly that), kept between requests.
///
/// A device can name a Web Push endpoint, so every request is held to
/// `https`, follows no redirect, uses no proxy from the environment, and
/// takes at most `maxResponseBytes` of answer.
public final class CurlClient: @unchecked Sendable {  // curl handles only on `thread` (asserted); the queue under `lock`
    public typealias Completion = @Sendable (Result<CurlResponse, CurlFailure>) -> Void

    private let name: String
    private let caFile: String?
    private let http2: Bool
    private let maxInFlight: Int
    private let maxResponseBytes: Int
    private let multi: UnsafeMutableRawPointer

    private let lock = NSLock()
    private var queue: [(CurlRequest, Completion)] = []
    private var stopping = false
    private var thread: Thread?
    private let finished = DispatchSemaphore(value: 0)
    private var loopThread: pthread_t?

    // Loop thread only.
    private var running: [UnsafeMutableRawPointer: Transfer] = [:]

    private static let globalInit: Void = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()

    public init(name: String, caFile: String?, http2: Bool, maxInFlight: Int, maxResponseBytes: Int = 64 * 1024) throws {
        _ = Self.globalInit
        guard let m = curl_multi_init() else { throw CurlFailure.other("curl_multi_init failed") }
        multi = m
        self.name = name; self.caFile = caFile; self.http2 = http2
        self.maxInFlight = max(1, maxInFlight); self.maxResponseBytes = maxResponseBytes
        _ = herald_multi_setopt_long(m, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        _ = herald_multi_setopt_long(m, CURLMOPT_MAX_HOST_CONNECTIONS, 1)
        _ = herald_multi_setopt_long(m, CURLMOPT_MAX_CONCURRENT_STREAMS, self.maxInFlight)
        let t = Thread { [self] in loop() }
        t.name = "herald-\(name)"
        thread = t
        t.start()
    }

    /// Any thread; never blocks. `completion` runs on the client's thread, once.
    public func send(_ r: CurlRequest, _ completion: @escaping Completion) {
        let accepted = lock.withLock { () -> Bool in
            guard !stopping else { return false }
            queue.append((r, completion))
            return true
        }
        guard accepted else { return completion(.failure(.stopped)) }
        curl_multi_wakeup(multi)
    }

    /// Ends the thread; requests queued or in flight complete with `.stopped`. Idempotent.
    public func shutdown() {
        let first = lock.withLock { () -> Bool in
            defer { stopping = true }
            return !stopping
        }
        guard first else { return }
        curl_multi_wakeup(multi)
        finished.wait()
        curl_multi_cleanup(multi)
    }

    deinit { shutdown() }

    // MARK: The loop thread

    private func assertOnLoop() {
        assert(loopThread.map { pthread_equal($0, pthread_self()) != 0 } ?? false, "curl handles are used on their client's thread only")
    }

    private func loop() {
        loopThread = pthread_self()
        var stillRunning: Int32 = 0
        while true {
            let (taken, stop) = lock.withLock { () -> ([(CurlRequest, Completion)], Bool) in
                let room = max(0, maxInFlight - running.count)
                let n = stopping ? 0 : min(room, queue.count)
                defer { queue.removeFirst(n) }
                return (Array(queue.prefix(n)), stopping)
            }
            if stop { break }
            for (r, c) in taken { start(r, c) }
            curl_multi_perform(multi, &stillRunning)
            collect()
            curl_multi_poll(multi, nil, 0, 1000, nil)
        }
        for t in running.values { abandon(t) }
        running.removeAll()
        let left = lock.withLock { () -> [(CurlRequest, Completion)] in defer { queue.removeAll() }; return queue }
        for (_, c) in left { c(.failure(.stopped)) }
        finished.signal()
    }

    private func start(_ r: CurlRequest, _ completion: @escaping Completion) {
        assertOnLoop()
        guard r.url.lowercased().hasPrefix("https://") else { return completion(.failure(.refused("only https URLs are sent to"))) }
        guard let easy = curl_easy_init() else { return completion(.failure(.other("curl_easy_init failed"))) }
        let t = Transfer(easy: easy, completion: completion, limit: maxResponseBytes)
        let me = Unmanaged.passUnretained(t).toOpaque()
        let millis = Int(r.timeout.components.seconds * 1000 + r.timeout.components.attoseconds / 1_000_000_000_000_000)
        _ = herald_curl_setopt_string(easy, CURLOPT_URL, r.url)
        _ = herald_curl_setopt_string(easy, CURLOPT_PROTOCOLS_STR, "https")
        _ = herald_curl_setopt_string(easy, CURLOPT_REDIR_PROTOCOLS_STR, "https")
        _ = herald_curl_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0)
        _ = herald_curl_setopt_string(easy, CURLOPT_PROXY, "")
        _ = herald_curl_setopt_long(easy, CURLOPT_NOSIGNAL, 1)
        _ = herald_curl_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1)
        _ = herald_curl_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2)
        if let caFile { _ = herald_curl_setopt_string(easy, CURLOPT_CAINFO, caFile) }
        _ = herald_curl_setopt_long(easy, CURLOPT_HTTP_VERSION, http2 ? Int(CURL_HTTP_VERSION_2TLS) : Int(CURL_HTTP_VERSION_1_1))
        _ = herald_curl_setopt_long(easy, CURLOPT_PIPEWAIT, 1)
        _ = herald_curl_setopt_long(easy, CURLOPT_TIMEOUT_MS, millis)
        _ = herald_curl_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, min(millis, 10_000))
        _ = herald_curl_setopt_pointer(easy, CURLOPT_PRIVATE, me)
        _ = herald_curl_setopt_write(easy, CURLOPT_WRITEFUNCTION, Transfer.onBody)
        _ = herald_curl_setopt_pointer(easy, CURLOPT_WRITEDATA, me)
        _ = herald_curl_setopt_write(easy, CURLOPT_HEADERFUNCTION, Transfer.onHeader)
        _ = herald_curl_setopt_pointer(easy, CURLOPT_HEADERDATA, me)
        if r.method == "POST" || !r.body.isEmpty {
            _ = herald_curl_setopt_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(r.body.count))
            // COPYPOSTFIELDS copies the bytes: the request need not outlive this call.
            if r.body.isEmpty {
                _ = herald_curl_setopt_string(easy, CURLOPT_COPYPOSTFIELDS, "")
            } else {
                _ = r.body.withUnsafeBufferPointer { b in
                    herald_curl_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: b.baseAddress!))
                }
            }
        }
        if r.method != "POST" && r.method != "GET" { _ = herald_curl_setopt_string(easy, CURLOPT_CUSTOMREQUEST, r.method) }
        // No "Expect: 100-continue" round trip before a body.
        for line in r.headers.map({ "\($0.0): \($0.1)" }) + ["Expect:"] { t.headerList = curl_slist_append(t.headerList, line) }
        _ = herald_curl_setopt_slist(easy, CURLOPT_HTTPHEADER, t.headerList)
        running[easy] = t
        curl_multi_add_handle(multi, easy)
    }

    private func collect() {
        assertOnLoop()
        var left: Int32 = 0
        while let m = curl_multi_info_read(multi, &left) {
            guard m.pointee.msg == CURLMSG_DONE, let easy = m.pointee.easy_handle,
                  let t = running.removeValue(forKey: easy) else { continue }
            let code = m.pointee.data.result
            curl_multi_remove_handle(multi, easy)
            t.completion(t.result(code))
            t.release()
        }
    }

    private func abandon(_ t: Transfer) {
        curl_multi_remove_handle(multi, t.easy)
        t.completion(.failure(.stopped))
        t.release()
    }

    /// One request in flight: its handle, what came back so far.
    private final class Transfer {
        let easy: UnsafeMutableRawPointer
        let completion: Completion
        let limit: Int
        var headerList: UnsafeMutablePointer<curl_slist>?
        var body: [UInt8] = []
        var headers: [String: String] = [:]
        var tooLarge = false

        init(easy: UnsafeMutableRawPointer, completion: @escaping Completion, limit: Int) {
            self.easy = easy; self.completion = completion; self.limit = limit
        }

        func release() {
            curl_easy_cleanup(easy)
            curl_slist_free_all(headerList)
        }

        static let onBody: curl_write_callback = { data, size, count, me in
            let t = Unmanaged<Transfer>.fromOpaque(me!).takeUnretainedValue()
            let n = size * count
            guard t.body.count + n <= t.limit else {
                t.tooLarge = true
                return 0  // ends the transfer with CURLE_WRITE_ERROR
            }
            data.map { t.body.append(contentsOf: UnsafeRawBufferPointer(start: $0, count: n)) }
            return n
        }

        static let onHeader: curl_write_callback = { data, size, count, me in
            let t = Unmanaged<Transfer>.fromOpaque(me!).takeUnretainedValue()
            let n = size * count
            guard let data else { return n }
            let line = String(decoding: UnsafeRawBufferPointer(start: data, count: n), as: UTF8.self)
            if line.hasPrefix("HTTP/") {
                t.headers = [:]  // a new response (after a 1xx)
            } else if let colon = line.firstIndex(of: ":") {
                t.headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespacesAndNewlines)
            }
            return n
        }

        func result(_ code: CURLcode) -> Result<CurlResponse, CurlFailure> {
            switch code {
            case CURLE_OK:
                var status = 0, version = 0
                _ = herald_curl_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
                _ = herald_curl_getinfo_long(easy, CURLINFO_HTTP_VERSION, &version)
                return .success(CurlResponse(status: status, headers: headers, body: body,
                                             httpVersion: version == Int(CURL_HTTP_VERSION_2_0) ? 2 : 1))
            case CURLE_WRITE_ERROR where tooLarge: return .failure(.tooLarge)
            case CURLE_OPERATION_TIMEDOUT: return .failure(.timedOut)
            case CURLE_UNSUPPORTED_PROTOCOL, CURLE_URL_MALFORMAT: return .failure(.refused(Self.message(code)))
            case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY: return .failure(.connect(Self.message(code)))
            case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CACERT_BADFILE:
                return .failure(.tls(Self.message(code)))
            default: return .failure(.other(Self.message(code)))
            }
        }

        static func message(_ code: CURLcode) -> String { String(cString: curl_easy_strerror(code)) }
    }
}
