import HeraldCurl

/// An HTTP/2 client for APNs and FCM, on a thread of its own, over nghttp2
/// and OpenSSL: one TLS connection per origin (ALPN must choose "h2"), its
/// streams multiplexed up to the server's SETTINGS_MAX_CONCURRENT_STREAMS.
/// A connection stays open however long it idles: every `pingInterval` of
/// quiet it is sent a PING, and one unanswered within `pingTimeout` (15 s,
/// or the interval if shorter) closes it, as do a socket error and EOF; the
/// next request opens another. A GOAWAY takes it out of use: the streams
/// the server did not process go again on a new connection, those it took
/// are answered on this one, which then closes.
///
/// libcurl 7.88 (Debian 12's) sends PINGs only on its easy interface's
/// connections, never on a multi handle's, which is why this client exists.
/// Like `CurlClient`: `https` only with the peer's certificate and name
/// checked, no redirect followed, no proxy, at most `maxResponseBytes` of
/// headers and as much of body.
public final class HTTP2Client: HTTPClient {
    private let loop: HTTP2Loop

    /// - Parameters:
    ///   - name: the thread's name (at most 15 bytes show).
    ///   - caFile: PEM certificates to trust instead of the system's.
    ///   - maxInFlight: requests on the wire at once; more wait their turn.
    ///   - pingInterval: how long a connection idles before a PING, and between PINGs.
    ///   - firstStreamID: where each connection's stream ids start (odd);
    ///     tests start near the last, 2^31 - 1, to see a connection use them up.
    public init(name: String, caFile: String?, maxInFlight: Int, maxResponseBytes: Int = 64 * 1024,
                pingInterval: Duration = .seconds(60), firstStreamID: Int32 = 1) throws {
        let limits = HTTP2Connection.Limits(maxResponseBytes: maxResponseBytes, pingInterval: pingInterval,
                                            pingTimeout: min(.seconds(15), pingInterval), firstStreamID: firstStreamID)
        loop = try HTTP2Loop(caFile: caFile, maxInFlight: max(1, maxInFlight), limits: limits)
        loop.start(name: name)
    }

    public func send(_ request: CurlRequest, _ completion: @escaping CurlClient.Completion) { loop.thread.add(request, completion) }

    public var inFlight: Int { loop.thread.counts.inFlight }

    public var waiting: Int { loop.thread.counts.waiting }

    public func shutdown() { loop.thread.stop() }

    deinit { loop.thread.stop() }
}
