import HeraldCore

/// The read-only queries: run on the reader thread when the store has a
/// reader connection, else on the engine. Each costs in proportion to what
/// it returns (and to the notifications it skips as invisible), never to a
/// user's whole history.
extension StoreReading {
    /// The notification `id` if `viewer` may see it.
    func visibleNotification(_ user: UserKey, id: String, viewer: Viewer) throws(StoreError) -> Notification? {
        guard let n = try notification(user, id: id), n.targeting.admits(viewer) else { return nil }
        return n
    }

    /// `GET /v1/me/counts` over what `viewer` may see: summed from the
    /// store's per-targeting counts.
    func visibleCounts(_ user: UserKey, viewer: Viewer) throws(StoreError) -> TargetingCounts {
        var c = TargetingCounts(targeting: .everyone)
        for t in try counts(user) where t.targeting.admits(viewer) {
            c.unread += t.unread; c.unseen += t.unseen; c.noInteraction += t.noInteraction; c.total += t.total
        }
        return c
    }

    /// One history page, encoded, and the position of the next, if any:
    /// at most `limit` notifications and, past the first, about `maxBytes`.
    func historyPage(_ user: UserKey, viewer: Viewer, filter: HistoryFilter = HistoryFilter(), after: HistoryKey?, limit: Int,
                     maxBytes: Int = .max) throws(StoreError) -> HistoryPage {
        var out: [[UInt8]] = []
        var bytes = 0
        var last: HistoryKey? = nil
        var from = after
        var batch = BatchSizer()
        while true {
            let want = batch.next(itemsLeft: limit - out.count, bytesLeft: maxBytes - bytes)
            let page = try history(user, after: from, limit: want)
            for n in page {
                guard n.targeting.admits(viewer) && filter.admits(n) else { batch.skipped(); continue }
                if out.count == limit || bytes >= maxBytes { return HistoryPage(notifications: out, next: last) }
                let b = n.encoded
                batch.took(b.count)
                bytes += b.count
                out.append(b)
                last = HistoryKey(n)
            }
            guard page.count == want, let end = page.last else { return HistoryPage(notifications: out, next: nil) }
            from = HistoryKey(end)
        }
    }

    /// The next page of a catch-up (see `Subscription`), read in one
    /// snapshot; `critical`: the app's critical groups, for a reset's preferences.
    func catchUpPage(_ user: UserKey, viewer: Viewer, epoch: String, step: CatchUpStep, bounds: PageBounds,
                     critical: [String]) throws(StoreError) -> CatchUpPage {
        let feed = try feed(user)
        func reset(after: HistoryKey?, head: Int64) throws(StoreError) -> CatchUpPage {
            .reset(try resetPage(user, viewer: viewer, after: after, head: head, bounds: bounds, critical: critical))
        }
        switch step {
        case .begin(let position):
            guard let cursor = position.resumable(in: feed, epoch: epoch) else { return try reset(after: nil, head: feed.head) }
            return .changes(try changesPage(user, viewer: viewer, after: cursor, feed: feed, bounds: bounds))
        case .changes(let after):
            // Retention overtook a slow catch-up: start over with a reset.
            guard feed.accepts(cursor: after) else { return try reset(after: nil, head: feed.head) }
            return .changes(try changesPage(user, viewer: viewer, after: after, feed: feed, bounds: bounds))
        case .reset(let after, let cursor):
            return try reset(after: after, head: cursor)
        }
    }

    /// Every page carries the preferences, for whichever page is the last
    /// its transport sends (SPEC section 12): one lookup by key.
    private func resetPage(_ user: UserKey, viewer: Viewer, after: HistoryKey?, head: Int64, bounds: PageBounds,
                           critical: [String]) throws(StoreError) -> ResetPage {
        let page = try historyPage(user, viewer: viewer, after: after, limit: bounds.items, maxBytes: bounds.bytes)
        return ResetPage(notifications: page.notifications, next: page.next, cursor: head,
                         preferences: try preferences(user).with(critical: critical).json.encoded)
    }

    /// Visible changes after `after`, up to the bounds; `complete` when they
    /// reach the feed's head, and then the viewer's unread and unseen counts as of it.
    private func changesPage(_ user: UserKey, viewer: Viewer, after: Int64, feed: FeedState, bounds: PageBounds) throws(StoreError) -> ChangesPage {
        var items: [EncodedChange] = []
        var bytes = 0
        var reached = after
        var batch = BatchSizer()
        while reached < feed.head {
            let page = try changes(user, after: reached, limit: batch.next(itemsLeft: bounds.items - items.count,
                                                                           bytesLeft: bounds.bytes - bytes))
            guard !page.isEmpty else { break }
            for r in page {
                if let b = r.bytes(for: viewer) {
                    if bounds.isFull(items: items.count, bytes: bytes) {
                        return ChangesPage(items: items, reached: reached, badge: nil)
                    }
                    items.append(EncodedChange(seq: r.seq, bytes: b))
                    bytes += b.count
                    batch.took(b.count)
                } else {
                    batch.skipped()
                }
                reached = r.seq
            }
        }
        return ChangesPage(items: items, reached: max(reached, feed.head), badge: try visibleCounts(user, viewer: viewer).badge)
    }
}

/// How many rows to ask the store for next: about what the page still
/// takes, judged by the sizes of the rows so far. A page of 64 KiB
/// notifications must not read (and parse) a thousand rows to send eight.
struct BatchSizer {
    private var rows = 0
    private var bytes = 0
    /// Rows the viewer may not see since the last one taken: they take no
    /// room in the page, so a run of them is read in growing batches.
    private var skippedRun = 0

    mutating func took(_ size: Int) { rows += 1; bytes += size; skippedRun = 0 }
    mutating func skipped() { rows += 1; skippedRun += 1 }

    /// One more than fits, so the page knows whether more follows.
    func next(itemsLeft: Int, bytesLeft: Int) -> Int {
        let byItems = max(itemsLeft, 0) + 1
        let fits = rows > 0 && bytes > 0 ? min(byItems, max(bytesLeft, 0) / max(1, bytes / rows) + 1) : min(byItems, 16)
        return max(1, min(max(fits, skippedRun), 1000))
    }
}

/// `readState` / `seenState` / `userActionState` filters of the history API.
struct HistoryFilter: Sendable {
    var readState: ReadState?
    var seenState: SeenState?
    var userActionState: UserActionState?
    func admits(_ n: Notification) -> Bool {
        (readState.map { $0 == n.readState } ?? true) && (seenState.map { $0 == n.seenState } ?? true)
            && (userActionState.map { $0 == n.userActionState } ?? true)
    }
}

struct HistoryPage: Sendable {
    /// Encoded notifications in history order.
    var notifications: [[UInt8]]
    /// Where the next page starts; nil when this was the last.
    var next: HistoryKey?

    /// `"notifications":[...],"next":...`, as a history answer has them (SPEC section 4).
    func appendFields(to body: inout [UInt8]) {
        body.append(contentsOf: #""notifications":"#.utf8)
        ServerFrame.appendArray(notifications, to: &body)
        body.append(contentsOf: #","next":"#.utf8)
        body.append(contentsOf: next.map(PageToken.encode).json.encoded)
    }
}

/// A change as one viewer receives it, encoded.
struct EncodedChange: Sendable {
    let seq: Int64
    let bytes: [UInt8]
}

/// How much one catch-up page carries: at most `items` (SPEC 5: 500 per
/// frame), and past the first item at most about `bytes`, so a history of
/// 64 KiB notifications goes out in frames a client can take.
struct PageBounds: Sendable {
    var items: Int
    var bytes: Int
    static let webSocket = PageBounds(items: 500, bytes: 512 * 1024)

    /// Whether a page holding `items` of `bytes` takes no more.
    func isFull(items n: Int, bytes b: Int) -> Bool { n >= items || b >= bytes }

    /// How many of `changes`, from the first, one page holds.
    func fitting(_ changes: [EncodedChange]) -> Int {
        var n = 0, b = 0
        while n < changes.count && !isFull(items: n, bytes: b) {
            b += changes[n].bytes.count
            n += 1
        }
        return n
    }
}

/// Where the next catch-up read starts.
enum CatchUpStep: Sendable {
    /// The client's position: changes after it, or a reset if it is unusable.
    case begin(FeedPosition)
    case changes(after: Int64)
    /// The next page of a reset whose position is `cursor`.
    case reset(after: HistoryKey, cursor: Int64)
}

enum CatchUpPage: Sendable {
    case reset(ResetPage)
    case changes(ChangesPage)
}

struct ResetPage: Sendable {
    /// Encoded notifications, newest first.
    var notifications: [[UInt8]]
    /// Where the rest of the reset continues; nil when this is all.
    var next: HistoryKey?
    /// The feed position the whole reset brings the client to.
    var cursor: Int64
    /// The user's preferences, encoded, as of this page's snapshot.
    var preferences: [UInt8]
}

struct ChangesPage: Sendable {
    var items: [EncodedChange]
    /// The feed position these changes bring the client to.
    var reached: Int64
    /// Set when the page reached the feed's head: the viewer's counts there.
    var badge: Badge?
    var complete: Bool { badge != nil }
}
