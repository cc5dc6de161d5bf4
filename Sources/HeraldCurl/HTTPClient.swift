/// What the push senders ask of an HTTP client: `CurlClient`, and
/// `HTTP2Client` (HeraldHTTP2), which keeps its connections alive with PINGs.
public protocol HTTPClient: AnyObject, Sendable {
    /// Any thread; never blocks. `completion` runs once, on the client's
    /// thread (so it should be quick), or at once on the caller's when the
    /// client has stopped.
    func send(_ request: CurlRequest, _ completion: @escaping CurlClient.Completion)
    /// Requests on the wire now, at most the client's `maxInFlight`.
    var inFlight: Int { get }
    /// Requests sent and waiting for room beyond `maxInFlight`.
    var waiting: Int { get }
    /// Ends the client's thread: what is waiting or in flight completes with
    /// `.stopped` before this returns. Idempotent, from any thread; from a
    /// completion, the rest complete as soon as it returns.
    func shutdown()
}
