import HeraldCore
import HeraldCurl
import HeraldPorts

/// Web Push (RFC 8030 delivery, RFC 8291 `aes128gcm` encryption, RFC 8292
/// VAPID), only to `https` endpoints on the app's allowed hosts: checked at
/// registration and again here, against the hosts in force now.
final class WebPushSender: Sendable {
    let credentials: LoadedCredentials.WebPush
    private let client: CurlClient
    /// VAPID tokens by audience (an endpoint's origin), reused for an hour of their 12.
    private let tokens = Locked<[String: (header: String, madeAt: Millis)]>([:])

    static let tokenLifetime: Millis = 12 * 3_600_000
    static let tokenReuse: Millis = 3_600_000

    init(_ c: LoadedCredentials.WebPush, app: String) throws {
        credentials = c
        client = try CurlClient(name: "webpush", caFile: c.settings.caFile, http2: true, maxInFlight: PushSenders.maxInFlight,
                                maxResponseBytes: 16 * 1024)
    }

    func stop() { client.shutdown() }

    private func authorization(_ audience: String, now: Millis) -> String {
        tokens.withLock { t in
            if let made = t[audience], now - made.madeAt < Self.tokenReuse { return made.header }
            if t.count > 64 { t.removeAll() }
            let header = credentials.vapid.authorization(audience: audience, subject: credentials.settings.subject,
                                                         expiresAt: (now + Self.tokenLifetime) / 1000)
            t[audience] = (header, now)
            return header
        }
    }

    func send(_ o: OutgoingPush, subscription s: WebPushSubscription, completion: @escaping @Sendable (PushOutcome) -> Void) {
        guard PushHandle.allowed(host: s.host, port: s.port, by: credentials.settings.allowedHosts) else {
            return completion(.rejected("Web Push host \(s.host) is no longer allowed", reason: "host_not_allowed"))
        }
        let m = o.job.message
        let first = Self.plaintext(m)
        post(first, m, to: s) { [self] r in
            // A service with a lower limit than the body (Mozilla's, for Firefox for Android): again as small as
            // it gets, without the change, rather than lose the push to its size.
            if case .success(let resp) = r, resp.status == 413 {
                let smallest = Self.plaintext(m, within: Self.smallestLimit)
                if smallest.count < first.count { return post(smallest, m, to: s) { completion(Self.outcome($0)) } }
            }
            completion(Self.outcome(r))
        }
    }

    /// Encrypts `plaintext` for `s` and POSTs it.
    private func post(_ plaintext: [UInt8], _ m: PushMessage, to s: WebPushSubscription,
                      _ done: @escaping @Sendable (Result<CurlResponse, CurlFailure>) -> Void) {
        let now = WallClock.now()
        let ciphertext: [UInt8]
        do { ciphertext = try WebPushEncryption.encrypt(plaintext: plaintext, p256dh: s.p256dh, auth: s.auth) } catch {
            return done(.failure(.refused("Web Push encryption: \(error)")))
        }
        var headers = [("authorization", authorization(s.origin, now: now)),
                       ("ttl", String(m.ttlSeconds(now: now))),
                       ("content-encoding", "aes128gcm"),
                       ("content-type", "application/octet-stream"),
                       ("urgency", m.high ? "high" : "normal")]
        // A later push with the same topic replaces one still waiting at the service.
        if let id = m.notificationId, Self.isTopic(id) { headers.append(("topic", id)) }
        client.send(CurlRequest(method: "POST", url: s.endpoint, headers: headers, body: ciphertext, timeout: PushSenders.requestTimeout),
                    done)
    }

    /// The smallest body limit a public push service documents: Mozilla's
    /// autopush for Firefox for Android, which it reaches through FCM ("data
    /// may be limited to only 2744 bytes"). Others take `WebPushEncryption.maxBody`.
    static let smallestLimit = 2_744

    /// The JSON the service worker decrypts: the `herald` field, the alert's
    /// text and, when its encrypted body stays within `smallestLimit`, the
    /// change itself; without the change, the text cut to fit `within`
    /// bytes of encrypted body.
    static func plaintext(_ m: PushMessage, within limit: Int = WebPushEncryption.maxBody) -> [UInt8] {
        func encode(_ m: PushMessage, change: Bool) -> [UInt8] {
            var o: JSONObject = ["herald": m.herald]
            if let t = m.title { o["title"] = .string(t) }
            if let b = m.body { o["body"] = .string(b) }
            if let g = m.threadId { o["groupName"] = .string(g) }
            if change, let c = m.change { o["change"] = c }
            return JSON.object(o).encoded
        }
        let full = encode(m, change: true)
        if m.change != nil, full.count + WebPushEncryption.overhead <= smallestLimit { return full }
        return encode(PushText.fit(m, within: limit - WebPushEncryption.overhead) { encode($0, change: false).count }, change: false)
    }

    /// RFC 8030 5.4: at most 32 characters of the URL-safe base64 alphabet.
    static func isTopic(_ s: String) -> Bool {
        s.utf8.count <= 32 && s.utf8.allSatisfy { c in
            (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || c == UInt8(ascii: "-") || c == UInt8(ascii: "_")
        }
    }

    static func outcome(_ result: Result<CurlResponse, CurlFailure>) -> PushOutcome {
        switch result {
        // A URL curl will not send to never becomes sendable: give it up.
        case .failure(.refused(let why)): return .rejected("Web Push: \(why)", reason: "unsendable")
        case .failure(let f): return .retry("Web Push: \(f)", retryAfterSeconds: nil)
        case .success(let r):
            // Push services give no reason codes common to them all: the status is the reason.
            let why = "Web Push \(r.status)", code = String(r.status)
            switch r.status {
            case 200...299: return .delivered
            case 404, 410: return .unregistered(why, reason: code)
            // 401 and 403 fall to rejected, not refused credentials (SPEC
            // names APNs' and FCM's only): a subscription made under another
            // VAPID key, or an endpoint that is no push service, would
            // otherwise mark the app failing. 406 is how WNS throttles.
            case 406, 429, 500...599: return .retry(why, retryAfterSeconds: r.retryAfterSeconds)
            default: return .rejected(why, reason: code)
            }
        }
    }
}
