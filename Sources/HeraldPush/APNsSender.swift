import HeraldCore
import HeraldCurl
import HeraldGateway

/// Apple Push Notification service, token-based provider authentication
/// (Apple: "Sending notification requests to APNs"): HTTP/2 over one
/// multiplexed connection per environment, an ES256 provider token renewed
/// every 40 minutes (Apple takes 20 to 60), the headers SPEC section 10 names.
final class APNsSender: Sendable {
    let credentials: LoadedCredentials.APNs
    private let clients: [APNsEnvironment: CurlClient]
    private let token: Locked<(jwt: String, issuedAt: Millis)?>

    static let renewEvery: Millis = 40 * 60_000
    /// Apple refuses a new token more often than this (TooManyProviderTokenUpdates).
    static let renewAtMostEvery: Millis = 20 * 60_000
    static let maxBody = 4_096

    /// Sends to devices of `environments` only (an environment-limited key serves one).
    init(_ c: LoadedCredentials.APNs, app: String, environments: [APNsEnvironment] = APNsEnvironment.allCases) throws {
        credentials = c
        var clients: [APNsEnvironment: CurlClient] = [:]
        for env in environments {
            clients[env] = try CurlClient(name: "apns-\(env.rawValue.prefix(4))", caFile: c.settings.caFile, http2: true,
                                          maxInFlight: PushSenders.maxInFlight)
        }
        self.clients = clients
        token = Locked(nil)
    }

    func stop() { for c in clients.values { c.shutdown() } }

    /// The provider token, made anew once it is `renewEvery` old (or, after
    /// Apple called it expired, once it is `renewAtMostEvery` old).
    private func providerToken(now: Millis, expired: Bool = false) -> String {
        token.withLock { t in
            if let t, now - t.issuedAt < (expired ? Self.renewAtMostEvery : Self.renewEvery) { return t.jwt }
            let jwt = JWS.sign(header: ["alg": "ES256", "kid": .string(credentials.settings.keyId)],
                               claims: ["iss": .string(credentials.settings.teamId), "iat": .int(now / 1000)],
                               es256: credentials.key)
            t = (jwt, now)
            return jwt
        }
    }

    func send(_ o: OutgoingPush, token deviceToken: String, environment: APNsEnvironment,
              completion: @escaping @Sendable (PushOutcome) -> Void) {
        let now = WallClock.now()
        let m = o.job.message
        let alert = m.kind == .alert
        var headers = [("authorization", "bearer " + providerToken(now: now)),
                       ("apns-topic", credentials.settings.topic),
                       ("apns-push-type", alert ? "alert" : "background"),
                       ("apns-priority", alert && m.high ? "10" : "5"),
                       ("apns-expiration", String(m.expiresAt / 1000)),
                       ("content-type", "application/json")]
        if alert, let id = m.notificationId { headers.append(("apns-collapse-id", id)) }
        let base = environment == .production ? credentials.settings.endpoint : credentials.settings.developmentEndpoint
        let request = CurlRequest(method: "POST", url: base + "/3/device/" + deviceToken, headers: headers,
                                  body: Self.body(m), timeout: PushSenders.requestTimeout)
        clients[environment]!.send(request) { [self] result in
            let outcome = Self.outcome(result)
            if case .credentialsRefused(let why) = outcome, why.contains("ExpiredProviderToken") {
                _ = providerToken(now: WallClock.now(), expired: true)
            }
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
