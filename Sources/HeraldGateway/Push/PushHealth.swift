import HeraldCore
import HeraldPorts

/// What `/healthz` says of push (SPEC section 10, docs/OPERATIONS.md "Push"):
/// credentials a service refused, and services calling most of an app's
/// handles dead for one reason, which is a configuration's doing (a wrong
/// `topic`, a sandbox build registered as production) more often than the
/// devices'.
final class PushHealth: Sendable {
    /// Whose credentials a service refused: an app's for one service, or for
    /// one APNs environment (each has its own connection, and may have its own key).
    struct Credentials: Hashable, Sendable {
        let app: String
        let service: PushService
        let environment: APNsEnvironment?

        init(_ app: String, _ handle: PushHandle) {
            self.app = app
            service = handle.service
            if case .apns(_, let env) = handle { environment = env } else { environment = nil }
        }

        var description: String {
            "app \(app)'s credentials" + (environment.map { " for \($0.rawValue) devices" } ?? "")
        }
    }

    struct AppService: Hashable, Sendable {
        let app: String
        let service: PushService
    }

    private let failing = Locked<Set<Credentials>>([])
    private let answers = Locked<[AppService: DeadHandleWatch]>([:])

    /// Whether these credentials were not already refused.
    func refused(_ c: Credentials) -> Bool { failing.withLock { $0.insert(c).inserted } }

    /// Whether these credentials had been refused.
    func accepted(_ c: Credentials) -> Bool { failing.withLock { $0.remove(c) != nil } }

    var isFailing: Bool { failing.withLock { !$0.isEmpty } }

    /// One answer of a service to a push of `app`: `deadReason` is the
    /// reason it called the handle dead, nil for any other answer. What
    /// changed in the judgement, if anything, for the log.
    func answered(_ app: String, _ service: PushService, deadReason: String?) -> DeadHandleWatch.Change? {
        answers.withLock { $0[AppService(app: app, service: service), default: DeadHandleWatch()].note(deadReason) }
    }

    /// `pushProblems` of `/healthz`, in a stable order.
    var problems: [JSON] {
        let refused = failing.withLock { $0 }.sorted {
            ($0.app, $0.service.rawValue, $0.environment?.rawValue ?? "") < ($1.app, $1.service.rawValue, $1.environment?.rawValue ?? "")
        }
        let suspect = answers.withLock { a in a.compactMap { k, w in w.suspect.map { (k, $0) } } }
            .sorted { ($0.0.app, $0.0.service.rawValue) < ($1.0.app, $1.0.service.rawValue) }
        return refused.map { c in
            var o: JSONObject = ["app": .string(c.app), "service": .string(c.service.rawValue)]
            if let env = c.environment { o["environment"] = .string(env.rawValue) }
            o["problem"] = "credentialsRefused"
            return .object(o)
        } + suspect.map { k, reason in
            ["app": .string(k.app), "service": .string(k.service.rawValue), "problem": "handlesDead", "reason": .string(reason)]
        }
    }
}

/// The last `window` answers of one service for one app, and whether most
/// of them called handles dead for one reason: once at least `minimum`
/// have come, more than half of them. A pure judgement: `PushHealth`
/// keeps one per app and service.
struct DeadHandleWatch: Sendable {
    static let window = 20
    static let minimum = 10

    enum Change: Equatable, Sendable {
        /// Most answers now call handles dead for this reason.
        case suspect(String)
        /// They no longer do.
        case cleared(String)
    }

    /// The last answers, oldest first: the reason a handle was called dead, or nil.
    private var recent: [String?] = []
    /// The reason most recent answers give, while they do.
    private(set) var suspect: String?

    mutating func note(_ deadReason: String?) -> Change? {
        recent.append(deadReason)
        if recent.count > Self.window { recent.removeFirst() }
        var counts: [String: Int] = [:]
        for case let r? in recent { counts[r, default: 0] += 1 }
        // More than half: one reason at most.
        let now = recent.count >= Self.minimum ? counts.first { $0.value * 2 > recent.count }?.key : nil
        guard now != suspect else { return nil }
        let was = suspect
        suspect = now
        if let now { return .suspect(now) }
        return was.map { .cleared($0) }
    }
}
