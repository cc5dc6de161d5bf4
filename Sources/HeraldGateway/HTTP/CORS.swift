import HeraldCore
import HeraldPorts

/// Browser pages on other origins (CORS; docs/PROTOCOL.md section 7.1).
/// Herald's credentials are bearer tokens and server keys, never cookies, so
/// no answer says `Access-Control-Allow-Credentials`, and an allowed origin
/// is echoed back whether it was listed or allowed by `*`.
public enum CORS {
    /// The request headers Herald reads (`Access-Control-Allow-Headers`).
    static let allowedHeaders = "Authorization, Content-Type, If-Match, Herald-Device, Last-Event-ID"
    /// The answer headers clients read that a page may not read unless told.
    static let exposedHeaders = "Retry-After"
    /// How long a browser may reuse a preflight's answer: also how long a
    /// page keeps sending requests after its origin was taken off the list.
    static let maxAgeSeconds = 600

    /// Whether `s` is an origin as browsers send it in `Origin`: a lower-case
    /// `scheme://host[:port]`, no path, no default port. (`null` is not: any
    /// sandboxed page sends it.)
    public static func isOrigin(_ s: String) -> Bool {
        guard let m = s.wholeMatch(of: /[a-z][a-z0-9+.\-]*:\/\/(?:[a-z0-9\-]+(?:\.[a-z0-9\-]+)*|\[[0-9a-f:.]+\])(?::([1-9][0-9]{0,4}))?/)
        else { return false }
        guard let p = m.output.1 else { return true }
        let port = Int(p)!
        return port <= 65535 && !(s.hasPrefix("http://") && port == 80) && !(s.hasPrefix("https://") && port == 443)
    }
}

extension AppConfig {
    func allows(origin: String) -> Bool { allowedOrigins.contains(origin) || allowedOrigins.contains("*") }

    /// Whether a request or WebSocket that sent `origin` (nil: none, not a
    /// browser) may act for this app. One that lists origins takes no
    /// others, so nothing of it changes from a page it does not allow, even
    /// one another app's list let through a preflight. One with no list
    /// takes any: same-origin pages (the demo's) send their origin too, and
    /// WebSockets across origins worked before lists existed.
    func admits(origin: String?) -> Bool { origin.map { allowedOrigins.isEmpty || allows(origin: $0) } ?? true }
}

extension Gateway {
    static let originRefused = HeraldError(.forbidden, "the app takes no requests from this origin")

    /// `responder`, adding to every answer to `req` the CORS headers its
    /// `Origin` gets (none unless some app allows an origin), and whether
    /// the app `req` proves admits that origin. Which app's list decides is
    /// the one whose credentials `req` carries; a request that proves no app
    /// (a preflight, a refused token, `/healthz`) is let read by any allowed
    /// origin, which tells nothing of any app.
    func crossOrigin(_ req: HTTPRequest, _ route: Route.Matched?, _ responder: HTTPResponder) -> (HTTPResponder, admitted: Bool) {
        guard apps.values.contains(where: { !$0.allowedOrigins.isEmpty }) else { return (responder, true) }
        var headers = [("Vary", "Origin")]
        var admitted = true
        if let origin = req.headers["origin"] {
            let app = route.flatMap { provenApp($0, req) }
            if app?.allows(origin: origin) ?? anyAppAllows(origin) {
                headers += [("Access-Control-Allow-Origin", origin), ("Access-Control-Expose-Headers", CORS.exposedHeaders)]
            }
            admitted = app?.admits(origin: origin) ?? true
        }
        return (HeaderAddingResponder(inner: responder, headers: headers), admitted)
    }

    /// The answer to a CORS preflight on a path whose methods are `methods`,
    /// or nil when `req` is no preflight from an allowed origin (an OPTIONS
    /// that stays `405`). A preflight carries no credentials, so any app's
    /// list lets it through; the request that follows is judged by its own
    /// app (`crossOrigin`).
    func preflight(_ req: HTTPRequest, methods: [String]) -> HTTPResponse? {
        guard req.method == "OPTIONS", req.headers["access-control-request-method"] != nil,
              let origin = req.headers["origin"], anyAppAllows(origin) else { return nil }
        return HTTPResponse(status: 204, headers: [("Access-Control-Allow-Methods", methods.joined(separator: ", ")),
                                                   ("Access-Control-Allow-Headers", CORS.allowedHeaders),
                                                   ("Access-Control-Max-Age", String(CORS.maxAgeSeconds))], body: [])
    }

    private func anyAppAllows(_ origin: String) -> Bool { apps.values.contains { $0.allows(origin: origin) } }

    /// The app `req`'s credentials prove, checked, by the credential its
    /// route takes: a server path's app with its key, or a device token's app.
    private func provenApp(_ m: Route.Matched, _ req: HTTPRequest) -> AppConfig? {
        switch m.route.credential {
        case .none: return nil
        case .serverKey: return m.serverApp.flatMap { try? serverAuth(req, $0) }
        case .deviceToken(let inQuery):
            guard let token = deviceToken(req, inQuery: inQuery), case .success(let v) = verify(token: token) else { return nil }
            return apps[v.claims.app]
        }
    }
}

/// Passes an answer on with `headers` added.
final class HeaderAddingResponder: HTTPResponder {
    let inner: HTTPResponder
    let headers: [(String, String)]

    init(inner: HTTPResponder, headers: [(String, String)]) { self.inner = inner; self.headers = headers }

    func respond(_ r: HTTPResponse) {
        var r = r
        r.headers += headers
        inner.respond(r)
    }
    func startStream(contentType: String, headers: [(String, String)]) {
        inner.startStream(contentType: contentType, headers: headers + self.headers)
    }
    func send(_ bytes: [UInt8]) { inner.send(bytes) }
    func finish() { inner.finish() }
    var queuedBytes: Int { inner.queuedBytes }
    func onClose(_ f: @escaping () -> Void) { inner.onClose(f) }
    func whenDrained(below bytes: Int, _ f: @escaping () -> Void) { inner.whenDrained(below: bytes, f) }
}
