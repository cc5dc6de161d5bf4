/// The HTTP client of Web Push and webhooks, on a thread of its own, over
/// libcurl's multi interface: HTTP/2 streams multiplexed on one connection
/// per host, or HTTP/1.1, kept between requests. (APNs and FCM use
/// HeraldHTTP2's client, which PINGs idle connections: libcurl 7.88's multi
/// interface sends no PING.)
///
/// A device can name a Web Push endpoint, so every request is held to
/// `https` (unless `plainHTTP`) with the peer's certificate checked, follows no redirect, uses no
/// proxy from the environment, and takes at most `maxResponseBytes` of
/// headers and as much of body.
public final class CurlClient: HTTPClient {
    public typealias Completion = @Sendable (Result<CurlResponse, CurlFailure>) -> Void

    private let loop: CurlLoop

    /// - Parameters:
    ///   - name: the thread's name (at most 15 bytes show).
    ///   - caFile: PEM certificates to trust instead of the system's.
    ///   - http2: HTTP/2 by ALPN, one connection per host; else HTTP/1.1.
    ///   - maxInFlight: requests on the wire at once; more wait their turn.
    ///   - idleLimit: how long an idle connection may be taken again; nil:
    ///     however long (libcurl's own limit, 118 s, would reconnect after
    ///     every quiet two minutes, which APNs asks senders not to do).
    ///     curl counts whole seconds. A connection the server closed, or
    ///     whose peer TCP keepalive found gone, is replaced whatever the limit.
    ///   - plainHTTP: `http://` URLs are sent to as well, for addresses an
    ///     operator chose (webhooks); never for one a device can name.
    public init(name: String, caFile: String?, http2: Bool, maxInFlight: Int, maxResponseBytes: Int = 64 * 1024,
                idleLimit: Duration? = nil, plainHTTP: Bool = false) throws {
        let idleSeconds = idleLimit.map { Int(($0 / .seconds(1)).rounded(.down)) } ?? Int.max
        loop = try CurlLoop(caFile: caFile, http2: http2, maxInFlight: max(1, maxInFlight), maxResponseBytes: maxResponseBytes,
                            idleSeconds: idleSeconds, plainHTTP: plainHTTP)
        loop.start(name: name)
    }

    public func send(_ request: CurlRequest, _ completion: @escaping Completion) { loop.thread.add(request, completion) }

    public var inFlight: Int { loop.thread.counts.inFlight }

    public var waiting: Int { loop.thread.counts.waiting }

    public func shutdown() { loop.thread.stop() }

    deinit { loop.thread.stop() }
}
