import HeraldCore
import HeraldCurl
import HeraldHTTP2
import HeraldPorts

/// Apple Push Notification service, token-based provider authentication
/// (Apple: "Sending notification requests to APNs"): HTTP/2 over one
/// multiplexed connection per environment (kept open, PINGed while idle), an ES256 provider token shared
/// by the deployment and renewed every 40 minutes (`ProviderToken`), the
/// headers SPEC section 10 names.
final class APNsSender: Sendable {
    let credentials: LoadedCredentials.APNs
    private let clients: [APNsEnvironment: HTTP2Client]
    private let token: ProviderToken

    static let maxBody = 4_096

    /// Sends to devices of `environments` only (an environment-limited key serves one).
    /// `pingInterval`: how long a connection idles before a PING, and between PINGs.
    init(_ c: LoadedCredentials.APNs, app: String, environments: [APNsEnvironment] = APNsEnvironment.allCases,
         pingInterval: Duration) throws {
        credentials = c
        var clients: [APNsEnvironment: HTTP2Client] = [:]
        for env in environments {
            clients[env] = try HTTP2Client(name: "apns-\(env.rawValue.prefix(4))", caFile: c.settings.caFile,
                                           maxInFlight: PushSenders.maxInFlight, pingInterval: pingInterval)
        }
        self.clients = clients
        token = ProviderToken(teamId: c.settings.teamId, keyId: c.settings.keyId, key: c.key)
    }

    func stop() { for c in clients.values { c.shutdown() } }

    /// `tokens`: where the provider token is kept.
    func send(_ o: OutgoingPush, token deviceToken: String, environment: APNsEnvironment, tokens: SharedTokens,
              completion: @escaping @Sendable (PushOutcome) -> Void) {
        token.use(now: WallClock.now(), in: tokens) { [self] jwt in
            guard let jwt else {
                return completion(.retry("APNs: no provider token (the store did not answer)", retryAfterSeconds: nil))
            }
            send(o, deviceToken, environment, jwt, completion)
        }
    }

    private func send(_ o: OutgoingPush, _ deviceToken: String, _ environment: APNsEnvironment, _ jwt: String,
                      _ completion: @escaping @Sendable (PushOutcome) -> Void) {
        let m = o.job.message
        let alert = m.kind == .alert
        var headers = [("authorization", "bearer " + jwt),
                       ("apns-topic", credentials.settings.topic),
                       ("apns-push-type", alert ? "alert" : "background"),
                       ("apns-priority", alert && m.high ? "10" : "5"),
                       ("apns-expiration", String(m.expiresAt / 1000)),
                       ("content-type", "application/json")]
        if alert, let id = m.notificationId { headers.append(("apns-collapse-id", id)) }
        let base = environment == .production ? credentials.settings.endpoint : credentials.settings.developmentEndpoint
        let request = CurlRequest(method: "POST", url: base + "/3/device/" + deviceToken, headers: headers,
                                  body: Self.body(m), timeout: PushSenders.requestTimeout)
        // TooManyProviderTokenUpdates is a 429 like any: the token is kept, the push retried.
        clients[environment]!.send(request) { [token] result in
            let outcome = Self.outcome(result)
            if case .credentialsRefused(let why) = outcome, why.contains("ExpiredProviderToken") { token.expired(jwt) }
            completion(outcome)
        }
    }

    /// `{"aps": ..., "herald": ...}`, at most 4 KiB: an alert's text is cut to fit.
    static func body(_ m: PushMessage) -> [UInt8] {
        func encode(_ m: PushMessage) -> [UInt8] {
            var aps: JSONObject
            if m.kind == .alert {
                aps = ["alert": ["title": .string(m.title ?? ""), "body": .string(m.body ?? "")]]
                if let thread = m.threadId { aps["thread-id"] = .string(thread) }
            } else {
                aps = ["content-available": 1]
            }
            return JSON.object(["aps": .object(aps), "herald": m.herald]).encoded
        }
        return encode(PushText.fit(m, within: maxBody) { encode($0).count })
    }

    /// Apple's status codes and `reason`s (the same document, "Handling
    /// notification responses from APNs").
    static func outcome(_ result: Result<CurlResponse, CurlFailure>) -> PushOutcome {
        switch result {
        case .failure(let f): return .retry("APNs: \(f)", retryAfterSeconds: nil)
        case .success(let r):
            let reason = (try? JSONParser.parse(r.body))?.objectValue?["reason"]?.stringValue ?? ""
            let why = "APNs \(r.status) \(reason)"
            let code = reasons.contains(reason) ? reason : String(r.status)
            switch r.status {
            case 200: return .delivered
            case 410: return .unregistered(why, reason: code)
            case 400 where reason == "BadDeviceToken" || reason == "DeviceTokenNotForTopic": return .unregistered(why, reason: code)
            case 403: return .credentialsRefused(why)
            case 429, 500...599: return .retry(why, retryAfterSeconds: r.retryAfterSeconds)
            default: return .rejected(why, reason: code)
            }
        }
    }

    /// The reasons Apple documents: the metric labels an answer may give
    /// (any other shows as its status), so a label's values stay few.
    static let reasons: Set<String> = [
        "BadCollapseId", "BadDeviceToken", "BadExpirationDate", "BadMessageId", "BadPriority", "BadTopic",
        "DeviceTokenNotForTopic", "DuplicateHeaders", "IdleTimeout", "InvalidPushType", "MissingDeviceToken", "MissingTopic",
        "PayloadEmpty", "TopicDisallowed", "BadCertificate", "BadCertificateEnvironment", "ExpiredProviderToken", "Forbidden",
        "InvalidProviderToken", "MissingProviderToken", "UnrelatedKeyIdInToken", "BadEnvironmentKeyInToken", "BadPath",
        "MethodNotAllowed", "ExpiredToken", "Unregistered", "PayloadTooLarge", "TooManyProviderTokenUpdates", "TooManyRequests",
        "InternalServerError", "ServiceUnavailable", "Shutdown",
    ]
}
