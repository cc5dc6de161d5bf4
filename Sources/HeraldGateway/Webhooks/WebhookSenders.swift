import HeraldCore
import HeraldCrypto
import HeraldCurl
import HeraldPorts

/// What a receiver's answer to one delivery means (SPEC section 13).
enum WebhookOutcome: Sendable, Equatable {
    /// A 2xx within the time-out.
    case delivered
    /// Anything else; `retryAfterSeconds` from the answer's `Retry-After`.
    case failed(String, retryAfterSeconds: Int?)
    /// Never sent: it waited `startWithin` for room on the wire (a slow or
    /// hung receiver holds the connections). Not an attempt.
    case notSent
}

/// The Standard Webhooks signature header (standardwebhooks.com): for
/// each key, `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`,
/// space-separated.
enum WebhookSignature {
    static func header(keys: [HMACSHA256.Key], id: String, timestamp: Int64, body: [UInt8]) -> String {
        let prefix = Array("\(id).\(timestamp).".utf8)
        return keys.map { "v1," + Base64.encode($0.mac(prefix, body)) }.joined(separator: " ")
    }
}

/// The HTTP side of webhooks: one curl client, on a thread of its own, per
/// endpoint URL (and CA file), so an endpoint that hangs holds up only its
/// own requests, never another endpoint's, a push or the engine. Clients
/// are made and ended as the config names endpoints (`configure`, at
/// start and each reload). Any thread.
public final class WebhookSenders: Sendable {
    /// Requests on the wire to one endpoint at once, one connection each:
    /// per node, as the partitions share the endpoint's client.
    static let perEndpoint = 16
    /// Deliveries `WebhookDispatch` claims for one endpoint at most, per
    /// partition. Those beyond `perEndpoint` wait in its client (at most
    /// `startWithin`), which starts the next as soon as an answer comes.
    /// With no more claimed than on the wire, each freed slot waited for the
    /// engine's next commit: the throughput bench delivered ~800 events/s
    /// while changes came at 1,800/s (64: ~1,500/s).
    static let claimedPerEndpoint = 256
    /// On the wire, from the request's start to the answer's last byte.
    static let timeout: Duration = .seconds(15)
    /// The longest a claimed delivery waits in the client for the wire.
    static let startWithin: Duration = .seconds(30)

    private struct Key: Hashable { let url: String; let caFile: String? }
    private let clients = Locked<[Key: CurlClient]>([:])
    /// The endpoints' secrets, each set up once for all the events it signs.
    private let signers = Locked<[[UInt8]: HMACSHA256.Key]>([:])

    public init() {}

    /// Makes the clients and signers of the endpoints `apps` name and ends the others'.
    func configure(_ apps: [AppConfig]) {
        let secrets = Set(apps.flatMap { $0.webhooks.flatMap(\.secrets) })
        signers.withLock { all in
            all = all.filter { secrets.contains($0.key) }
            for s in secrets where all[s] == nil { all[s] = HMACSHA256.Key(s) }
        }
        let wanted = Set(apps.flatMap { $0.webhooks.map { Key(url: $0.url, caFile: $0.caFile) } })
        let ended: [CurlClient] = clients.withLock { all in
            let gone = all.keys.filter { !wanted.contains($0) }
            for k in wanted where all[k] == nil {
                // An HTTP/1.1 client (a receiver is any web server), one
                // connection per request in flight.
                do {
                    all[k] = try CurlClient(name: "herald-webhook", caFile: k.caFile, http2: false, maxInFlight: Self.perEndpoint,
                                            plainHTTP: true)
                } catch {
                    Log.error("webhook: no client for \(k.url) (\(error)); its events wait in the outbox")
                }
            }
            return gone.compactMap { all.removeValue(forKey: $0) }
        }
        for c in ended { c.shutdown() }
    }

    /// Sends `job` to `endpoint`, signed with each of its secrets, as of
    /// `now`; `completion` runs once, on the client's thread.
    func send(_ job: WebhookJob, to endpoint: WebhookEndpoint, now: Millis, _ completion: @escaping @Sendable (WebhookOutcome) -> Void) {
        guard let client = clients.withLock({ $0[Key(url: endpoint.url, caFile: endpoint.caFile)] }) else {
            return completion(.failed("no client", retryAfterSeconds: nil))
        }
        let timestamp = now.floorDiv(1_000)
        // A secret that a reload under way has not set up yet is set up for this event alone.
        let keys = endpoint.secrets.compactMap { s in signers.withLock { $0[s] } ?? HMACSHA256.Key(s) }
        let headers = [("webhook-id", job.eventId), ("webhook-timestamp", String(timestamp)),
                       ("webhook-signature", WebhookSignature.header(keys: keys, id: job.eventId, timestamp: timestamp, body: job.body)),
                       ("content-type", "application/json"), ("user-agent", "Herald-Webhooks")]
        client.send(CurlRequest(method: "POST", url: endpoint.url, headers: headers, body: job.body, timeout: Self.timeout,
                                startWithin: Self.startWithin)) { result in
            switch result {
            case .success(let r) where (200..<300).contains(r.status): completion(.delivered)
            case .failure(.notStarted): completion(.notSent)
            case .success(let r): completion(.failed("status \(r.status)", retryAfterSeconds: r.retryAfterSeconds))
            case .failure(let f): completion(.failed("\(f)", retryAfterSeconds: nil))
            }
        }
    }

    /// Ends every client; what is in flight completes as failed.
    func stop() {
        for c in clients.withLock({ all in defer { all.removeAll() }; return Array(all.values) }) { c.shutdown() }
    }
}
