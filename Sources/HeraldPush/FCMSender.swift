import Foundation
import HeraldCore
import HeraldCurl
import HeraldHTTP2
import HeraldPorts

/// Firebase Cloud Messaging, HTTP v1 API: an OAuth 2.0 access token from the
/// service account's JWT-bearer grant (RS256, sent to its `token_uri`),
/// reused until a minute before it expires; `messages:send` with a data
/// message whose values are strings (SPEC section 10).
final class FCMSender: Sendable {
    let credentials: LoadedCredentials.FCM
    /// The OAuth token requests' too.
    private let client: HTTP2Client

    /// An access token, or what the sends waiting for one are answered.
    private enum Access { case token(String), failed(PushOutcome) }

    private struct TokenState {
        var token: String?
        var expiresAt: Millis = 0
        /// Sends waiting for a token being fetched.
        var waiting: [@Sendable (Access) -> Void] = []
    }
    private let state = Locked(TokenState())

    static let scope = "https://www.googleapis.com/auth/firebase.messaging"

    /// `pingInterval`: how long a connection idles before a PING, and between PINGs.
    init(_ c: LoadedCredentials.FCM, app: String, pingInterval: Duration) throws {
        credentials = c
        client = try HTTP2Client(name: "fcm", caFile: c.settings.caFile, maxInFlight: PushSenders.maxInFlight, pingInterval: pingInterval)
    }

    func stop() { client.shutdown() }

    func send(_ o: OutgoingPush, token deviceToken: String, completion: @escaping @Sendable (PushOutcome) -> Void) {
        withAccessToken { [self] result in
            switch result {
            case .failed(let outcome): completion(outcome)
            case .token(let access):
                let url = credentials.settings.endpoint + "/v1/projects/\(credentials.account.projectId)/messages:send"
                let request = CurlRequest(method: "POST", url: url,
                                          headers: [("authorization", "Bearer " + access), ("content-type", "application/json")],
                                          body: Self.body(o.job.message, token: deviceToken, now: WallClock.now()),
                                          timeout: PushSenders.requestTimeout)
                client.send(request) { [self] r in
                    let outcome = Self.outcome(r)
                    // A token the service no longer takes is fetched anew for the next send.
                    if case .success(let resp) = r, resp.status == 401 { state.withLock { $0.token = nil } }
                    completion(outcome)
                }
            }
        }
    }

    /// FCM's limit on a data message's payload.
    static let maxData = 4_000

    /// A data message (all values strings) with the `herald` field's names,
    /// an alert's text cut to fit FCM's 4,000 bytes.
    static func body(_ m: PushMessage, token: String, now: Millis) -> [UInt8] {
        func data(_ m: PushMessage) -> JSONObject {
            var data: JSONObject = ["kind": .string(m.kind.rawValue), "cursor": .string(String(m.cursor)), "epoch": .string(m.epoch),
                                    "op": .string(m.op.rawValue)]
            if let id = m.notificationId { data["id"] = .string(id) }
            if let t = m.title { data["title"] = .string(t) }
            if let b = m.body { data["body"] = .string(b) }
            if let g = m.threadId { data["groupName"] = .string(g) }
            return data
        }
        let fitted = data(PushText.fit(m, within: maxData) { JSON.object(data($0)).encoded.count })
        let ttl = m.ttlSeconds(now: now)
        var android: JSONObject = ["priority": .string(m.high ? "high" : "normal"), "ttl": .string("\(ttl)s")]
        // Taps collapse, as they share one outbox row. Alerts do not: FCM
        // keeps at most four collapse keys for a device that is away.
        if m.kind == .tap { android["collapse_key"] = "herald-sync" }
        return JSON.object(["message": ["token": .string(token), "data": .object(fitted), "android": .object(android)]]).encoded
    }

    /// Google's error form: `{"error": {"code", "status", "message", "details": [{"errorCode"}]}}`.
    static func outcome(_ result: Result<CurlResponse, CurlFailure>) -> PushOutcome {
        switch result {
        case .failure(let f): return .retry("FCM: \(f)", retryAfterSeconds: nil)
        case .success(let r):
            let error = (try? JSONParser.parse(r.body))?.objectValue?["error"]?.objectValue
            let code = error?["details"]?.arrayValue?.compactMap { $0.objectValue?["errorCode"]?.stringValue }.first
                ?? error?["status"]?.stringValue ?? ""
            let message = error?["message"]?.stringValue ?? ""
            let why = "FCM \(r.status) \(code)"
            let label = errorCodes.contains(code) ? code : String(r.status)
            switch r.status {
            case 200: return .delivered
            // Only FCM's own word: a bare 404 (a wrong project or endpoint) must not remove every handle.
            case 404 where code == "UNREGISTERED": return .unregistered(why, reason: label)
            case 400 where code == "INVALID_ARGUMENT" && message.lowercased().contains("registration token"):
                return .unregistered(why, reason: label)
            // The token belongs to another Firebase project: no sender of this one will ever reach it.
            case 403 where code == "SENDER_ID_MISMATCH": return .unregistered(why, reason: label)
            case 401, 403: return .credentialsRefused(why)
            // Google: "wait at least 60 seconds" after a QUOTA_EXCEEDED, whatever Retry-After says.
            case 429: return .retry(why, retryAfterSeconds: max(minQuotaWait, r.retryAfterSeconds ?? 0))
            case 500...599: return .retry(why, retryAfterSeconds: r.retryAfterSeconds)
            default: return .rejected(why + (message.isEmpty ? "" : ": \(message)"), reason: label)
            }
        }
    }

    static let minQuotaWait = 60

    /// FCM's `ErrorCode`s and Google's canonical statuses (the `status` of an
    /// answer without details): the metric labels an answer may give (any
    /// other shows as its HTTP status).
    static let errorCodes: Set<String> = [
        "UNSPECIFIED_ERROR", "INVALID_ARGUMENT", "UNREGISTERED", "SENDER_ID_MISMATCH", "QUOTA_EXCEEDED", "UNAVAILABLE",
        "INTERNAL", "THIRD_PARTY_AUTH_ERROR", "NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION", "OUT_OF_RANGE", "ALREADY_EXISTS", "ABORTED", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN",
        "UNIMPLEMENTED", "DATA_LOSS",
    ]

    // MARK: The access token

    private func withAccessToken(_ use: @escaping @Sendable (Access) -> Void) {
        let now = WallClock.now()
        enum Next { case use(String), fetch, wait }
        let next: Next = state.withLock { s in
            if let t = s.token, now < s.expiresAt { return .use(t) }
            s.waiting.append(use)
            return s.waiting.count == 1 ? .fetch : .wait
        }
        switch next {
        case .use(let t): use(.token(t))
        case .wait: break
        case .fetch: fetchToken(now: now)
        }
    }

    private func fetchToken(now: Millis) {
        let a = credentials.account
        var header: JSONObject = ["alg": "RS256", "typ": "JWT"]
        if let kid = a.privateKeyId { header["kid"] = .string(kid) }
        let assertion = JWS.sign(header: header, claims: ["iss": .string(a.clientEmail), "scope": .string(Self.scope),
                                                         "aud": .string(a.tokenURI), "iat": .int(now / 1000),
                                                         "exp": .int(now / 1000 + 3600)], rs256: a.key)
        let form = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=" + assertion
        let request = CurlRequest(method: "POST", url: a.tokenURI, headers: [("content-type", "application/x-www-form-urlencoded")],
                                  body: Array(form.utf8), timeout: PushSenders.requestTimeout)
        client.send(request) { [self] r in
            let result: Access
            switch r {
            case .failure(let f): result = .failed(.retry("FCM token: \(f)", retryAfterSeconds: nil))
            case .success(let resp):
                let o = (try? JSONParser.parse(resp.body))?.objectValue
                if resp.status == 200, let t = o?["access_token"]?.stringValue, let expiresIn = o?["expires_in"]?.int64Value {
                    state.withLock { s in s.token = t; s.expiresAt = WallClock.now() + max(0, expiresIn - 60) * 1000 }
                    result = .token(t)
                } else if resp.status == 400 || resp.status == 401 || resp.status == 403 {
                    result = .failed(.credentialsRefused("FCM token \(resp.status) \(o?["error"]?.stringValue ?? "")"))
                } else {
                    result = .failed(.retry("FCM token \(resp.status)", retryAfterSeconds: resp.retryAfterSeconds))
                }
            }
            let waiting = state.withLock { s in defer { s.waiting.removeAll() }; return s.waiting }
            for w in waiting { w(result) }
        }
    }
}
