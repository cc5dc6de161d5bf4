import CCurl
import Foundation

/// An easy handle and what has come back so far of the request it carries.
/// Its client keeps it for the next request once this one ends: options
/// that never change are set once (`init`), the rest for each request
/// (`configure`), so a request costs no curl_easy_init, setup and cleanup.
/// Used on its client's loop thread only.
final class CurlTransfer {
    let easy: UnsafeMutableRawPointer
    /// The request's, from `configure` to `reset`.
    private(set) var completion: CurlClient.Completion?
    /// Bytes of headers, and of body, taken at most.
    private let limit: Int
    private var headerList: UnsafeMutablePointer<curl_slist>?
    /// curl's account of a failure (CURLOPT_ERRORBUFFER), which must last as long as the handle.
    private let errorText: UnsafeMutablePointer<CChar>
    private var headers: [String: String] = [:]
    private var headerBytes = 0
    private var body: [UInt8] = []
    private var overLimit = false

    /// A handle taking a connection idle at most `idleSeconds`; nil when
    /// curl cannot make one or refuses an option.
    init?(limit: Int, caFile: String?, http2: Bool, idleSeconds: Int, plainHTTP: Bool) {
        guard let easy = curl_easy_init() else { return nil }
        self.easy = easy; self.limit = limit
        errorText = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorText.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE))
        let me = Unmanaged.passUnretained(self).toOpaque()
        var codes = [
            // A device can name a Web Push endpoint, so nothing here may reach
            // further than that: https only (http too where an operator chose
            // the address), no redirect, no proxy from the environment.
            herald_curl_setopt_string(easy, CURLOPT_PROTOCOLS_STR, plainHTTP ? "http,https" : "https"),
            herald_curl_setopt_string(easy, CURLOPT_REDIR_PROTOCOLS_STR, "https"),
            herald_curl_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0),
            herald_curl_setopt_string(easy, CURLOPT_PROXY, ""),
            herald_curl_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1),
            herald_curl_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2),
            // No signals: curl would otherwise set SIGALRM for name lookups and
            // swap the SIGPIPE handler, for the whole process, from this thread.
            herald_curl_setopt_long(easy, CURLOPT_NOSIGNAL, 1),
            // Idle connections are kept for the next request (CURLOPT_MAXAGE_CONN, the
            // one this request may take): TCP keepalive holds middleboxes' state for
            // them and notices the ones whose peer went. (libcurl 7.88 sends HTTP/2
            // PINGs only from curl_easy_upkeep, which reaches the easy interface's
            // connections, not a multi handle's.)
            herald_curl_setopt_long(easy, CURLOPT_MAXAGE_CONN, idleSeconds),
            herald_curl_setopt_long(easy, CURLOPT_TCP_KEEPALIVE, 1),
            herald_curl_setopt_long(easy, CURLOPT_HTTP_VERSION, Int(http2 ? CURL_HTTP_VERSION_2TLS : CURL_HTTP_VERSION_1_1)),
            // Wait for a connection still being set up and multiplex on it, rather than open another.
            herald_curl_setopt_long(easy, CURLOPT_PIPEWAIT, http2 ? 1 : 0),
            // A Content-Length over the limit fails before any of the body is read.
            herald_curl_setopt_off(easy, CURLOPT_MAXFILESIZE_LARGE, curl_off_t(limit)),
            herald_curl_setopt_pointer(easy, CURLOPT_ERRORBUFFER, errorText),
            herald_curl_setopt_write(easy, CURLOPT_HEADERFUNCTION, Self.onHeader),
            herald_curl_setopt_pointer(easy, CURLOPT_HEADERDATA, me),
            herald_curl_setopt_write(easy, CURLOPT_WRITEFUNCTION, Self.onBody),
            herald_curl_setopt_pointer(easy, CURLOPT_WRITEDATA, me),
        ]
        if let caFile { codes.append(herald_curl_setopt_string(easy, CURLOPT_CAINFO, caFile)) }
        // An option curl refused could be one of the safety settings: no handle then.
        guard codes.allSatisfy({ $0 == CURLE_OK }) else { return nil }
    }

    deinit {
        curl_easy_cleanup(easy)
        curl_slist_free_all(headerList)
        errorText.deallocate()
    }

    /// Sets the handle up for `r` with `timeout` left; nil when it is ready
    /// to go. A handle that failed here is not used again.
    func configure(_ r: CurlRequest, timeout: Duration, plainHTTP: Bool, completion: @escaping CurlClient.Completion) -> CurlFailure? {
        self.completion = completion
        if let problem = r.refusal(plainHTTP: plainHTTP) { return .refused(problem) }
        for (name, value) in r.headers {
            // "Name;" is how curl sends an empty value: "Name:" would drop the header.
            headerList = curl_slist_append(headerList, value.isEmpty ? "\(name);" : "\(name): \(value)")
        }
        // No "Expect: 100-continue" round trip before a body.
        headerList = curl_slist_append(headerList, "Expect:")
        let ms = Int(min(max(1, (timeout / .milliseconds(1)).rounded(.up)), Double(Int32.max)))
        var codes = [
            herald_curl_setopt_string(easy, CURLOPT_URL, r.url),
            herald_curl_setopt_long(easy, CURLOPT_TIMEOUT_MS, ms),
            herald_curl_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, min(ms, 10_000)),
            herald_curl_setopt_slist(easy, CURLOPT_HTTPHEADER, headerList),
            // The method of the handle's last request must not carry over.
            herald_curl_setopt_string(easy, CURLOPT_CUSTOMREQUEST, nil),
        ]
        switch r.method {
        case "GET" where r.body.isEmpty: codes.append(herald_curl_setopt_long(easy, CURLOPT_HTTPGET, 1))
        default:
            codes.append(herald_curl_setopt_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(r.body.count)))
            // curl copies the bytes (an empty body still needs a pointer, or curl would send no body at all).
            codes.append(r.body.isEmpty ? herald_curl_setopt_string(easy, CURLOPT_COPYPOSTFIELDS, "")
                : r.body.withUnsafeBytes { herald_curl_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: $0.baseAddress)) })
            if r.method != "POST" { codes.append(herald_curl_setopt_string(easy, CURLOPT_CUSTOMREQUEST, r.method)) }
        }
        return codes.first { $0 != CURLE_OK }.map { .other("curl_easy_setopt: " + String(cString: curl_easy_strerror($0))) }
    }

    /// Forgets the request that ended, ready for the next.
    func reset() {
        completion = nil
        curl_slist_free_all(headerList)
        headerList = nil
        errorText.pointee = 0
        headers = [:]
        headerBytes = 0
        body = []
        overLimit = false
    }

    /// The answer, or the failure that `code` (the transfer's end) stands for.
    func result(_ code: CURLcode) -> Result<CurlResponse, CurlFailure> {
        guard code == CURLE_OK else {
            if overLimit { return .failure(.tooLarge) }
            let detail = errorText.pointee != 0 ? String(cString: errorText) : String(cString: curl_easy_strerror(code))
            return .failure(CurlFailure(code, detail: detail))
        }
        var status = 0, version = 0
        _ = herald_curl_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
        _ = herald_curl_getinfo_long(easy, CURLINFO_HTTP_VERSION, &version)
        return .success(CurlResponse(status: status, headers: headers, body: body,
                                     httpVersion: version == Int(CURL_HTTP_VERSION_2_0) ? 2 : 1))
    }

    // Returning less than they were given ends the transfer (CURLE_WRITE_ERROR).

    private static let onHeader: curl_write_callback = { data, size, count, me in
        let t = Unmanaged<CurlTransfer>.fromOpaque(me!).takeUnretainedValue()
        let n = size * count
        t.headerBytes += n
        guard t.headerBytes <= t.limit else { t.overLimit = true; return 0 }
        guard let data else { return n }
        // On bytes: a header line is ASCII but for what a value may hold.
        let line = UnsafeRawBufferPointer(start: data, count: n)
        if line.starts(with: "HTTP/".utf8) {
            t.headers = [:]  // the final answer after a 1xx
        } else if let colon = line.firstIndex(of: UInt8(ascii: ":")) {
            let blank: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0D || $0 == 0x0A }
            var value = line[(colon + 1)...]
            while let b = value.first, blank(b) { value = value.dropFirst() }
            while let b = value.last, blank(b) { value = value.dropLast() }
            t.headers[String(decoding: line[..<colon], as: UTF8.self).lowercased()] = String(decoding: value, as: UTF8.self)
        }
        return n
    }

    private static let onBody: curl_write_callback = { data, size, count, me in
        let t = Unmanaged<CurlTransfer>.fromOpaque(me!).takeUnretainedValue()
        let n = size * count
        guard t.body.count + n <= t.limit else { t.overLimit = true; return 0 }
        if let data { t.body.append(contentsOf: UnsafeRawBufferPointer(start: data, count: n)) }
        return n
    }
}
