import HeraldCore

/// The PostgreSQL store's schema and its migrations.
///
/// Versions are rows of `herald_schema`; migrations run at start, in one
/// transaction, under an advisory lock: of several nodes starting at once
/// one migrates, the others wait for it and then find nothing left to do.
/// Tables are created in the connection's schema (`search_path`), so one
/// database can hold several Herald deployments, one schema each.
enum PostgresSchema {
    /// The schema version this code writes; `migrations[v - 1]` brings a
    /// database from version `v - 1` to `v`.
    static var version: Int64 { Int64(migrations.count) }

    /// The advisory lock key of migrations ("Herald" in ASCII).
    static let migrationLock: Int64 = 0x4865_7261_6C64

    /// Forward migrations. Append only; never edit a released one.
    /// Keys and ids are COLLATE "C": byte order, as history order wants,
    /// and cheaper to compare than a locale's.
    static let migrations: [String] = [
        // 1: the initial schema (SQLiteStore's version 3, in PostgreSQL's types).
        """
        CREATE TABLE herald_meta (
            key   text COLLATE "C" PRIMARY KEY,
            value text NOT NULL
        );

        -- One row per user: head is the last seq assigned, floor the highest
        -- pruned seq. The row is also the user's write lock (see
        -- PostgresStore.lock). Rows are never deleted.
        CREATE TABLE feeds (
            app     text COLLATE "C" NOT NULL,
            user_id text COLLATE "C" NOT NULL,
            head    bigint NOT NULL,
            floor   bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (app, user_id)
        );

        -- Live notifications. `json` is the wire form (Notification.json),
        -- kept as text so that it reads back byte for byte; the other columns
        -- are copies for lookups, ordering and counts (count_* is the
        -- notification's TargetingKey).
        CREATE TABLE notifications (
            app                 text COLLATE "C" NOT NULL,
            user_id             text COLLATE "C" NOT NULL,
            id                  text COLLATE "C" NOT NULL,
            app_notification_id text COLLATE "C" NOT NULL,
            created_at          bigint NOT NULL,
            expires_at          bigint NOT NULL,
            read_state          text NOT NULL,
            user_action_state   text NOT NULL,
            version             bigint NOT NULL,
            count_platforms     text NOT NULL,
            count_tags          text NOT NULL,
            json                text NOT NULL,
            PRIMARY KEY (app, user_id, id)
        );
        CREATE UNIQUE INDEX notifications_by_app_id ON notifications (app, user_id, app_notification_id);
        CREATE INDEX notifications_history ON notifications (app, user_id, created_at DESC, id DESC);
        CREATE INDEX notifications_expiry ON notifications (expires_at);

        -- The change feed, one row per seq; `change` is the wire form
        -- (Change.json). Presence before/after: *_unread NULL when absent,
        -- *_platforms NULL for all platforms else comma-separated, *_tags the
        -- tag expression's source, NULL for all devices.
        CREATE TABLE changes (
            app              text COLLATE "C" NOT NULL,
            user_id          text COLLATE "C" NOT NULL,
            seq              bigint NOT NULL,
            at               bigint NOT NULL,
            change           text NOT NULL,
            before_unread    boolean,
            before_platforms text,
            before_tags      text,
            after_unread     boolean,
            after_platforms  text,
            after_tags       text,
            PRIMARY KEY (app, user_id, seq)
        );
        CREATE INDEX changes_by_at ON changes (at);

        -- Live notifications per user and targeting (TargetingKey), kept by
        -- every upsert and delete in the same transaction; a row whose total
        -- reaches 0 is deleted.
        CREATE TABLE counts (
            app            text COLLATE "C" NOT NULL,
            user_id        text COLLATE "C" NOT NULL,
            platforms      text COLLATE "C" NOT NULL,
            tags           text COLLATE "C" NOT NULL,
            unread         bigint NOT NULL,
            no_interaction bigint NOT NULL,
            total          bigint NOT NULL,
            PRIMARY KEY (app, user_id, platforms, tags)
        );

        -- Device registrations; `registered` keeps registration order.
        CREATE TABLE devices (
            app             text COLLATE "C" NOT NULL,
            user_id         text COLLATE "C" NOT NULL,
            device_id       text COLLATE "C" NOT NULL,
            platform        text NOT NULL,
            tags            text NOT NULL,
            last_seen_at    bigint NOT NULL,
            view_generation bigint NOT NULL,
            registered      bigint GENERATED ALWAYS AS IDENTITY,
            PRIMARY KEY (app, user_id, device_id)
        );
        CREATE INDEX devices_by_last_seen ON devices (last_seen_at);
        """,
        // 2: presence across nodes (ClusterDirectory). UNLOGGED: it is
        // rewritten every few seconds and worth nothing after a crash, so
        // it costs no WAL; a crash empties it, and each node's next lease
        // renewal finds its lease gone and writes its records again.
        """
        -- The gateway nodes and until when each is taken to be alive.
        CREATE UNLOGGED TABLE herald_nodes (
            node        text COLLATE "C" PRIMARY KEY,
            lease_until timestamptz NOT NULL
        );

        -- Devices connected to a node; `until` NULL for an open connection
        -- (as long as the node's lease runs), else the end of a poll's minute.
        CREATE UNLOGGED TABLE herald_connections (
            app       text COLLATE "C" NOT NULL,
            user_id   text COLLATE "C" NOT NULL,
            device_id text COLLATE "C" NOT NULL,
            node      text COLLATE "C" NOT NULL,
            transport text NOT NULL,
            until     timestamptz,
            PRIMARY KEY (app, user_id, device_id, node)
        );
        CREATE INDEX herald_connections_by_node ON herald_connections (node);
        """,
        // 3: as SQLite's version 5, a notification's JSON is written once,
        // in its change (a 64 KiB notification was written twice): the row
        // points at that change (`seq`) and keeps `json` empty. A change
        // pruned while a notification points at it stays below the floor
        // with `at` NULL (out of the pruning scan), until its notification
        // changes or goes. A change names its notification, so pruning can
        // tell which are pointed at. Rows written before keep their JSON and
        // a NULL seq. Only catalog changes: instant on a large database.
        """
        ALTER TABLE notifications ADD COLUMN seq bigint;
        ALTER TABLE changes ADD COLUMN notification_id text COLLATE "C";
        ALTER TABLE changes ALTER COLUMN at DROP NOT NULL;
        """,
        // 4: a batch that takes its users' heads from the node's cache
        // instead of reading them checks them under the users' locks, in
        // the same pipeline (PostgresStore.claim): a head another node moved
        // fails the transaction as a serialization failure, which the
        // engine runs again, reading.
        """
        CREATE FUNCTION herald_expect_heads(apps text[], users text[], expected bigint[]) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT count(*) FROM feeds f JOIN unnest(apps, users, expected) AS k(app, user_id, head)
                ON f.app = k.app AND f.user_id = k.user_id AND f.head = k.head) <> cardinality(apps) THEN
                RAISE EXCEPTION 'a feed moved since this node last saw it' USING ERRCODE = 'serialization_failure';
            END IF;
        END
        $$;
        """,
        // 5: push handles on registrations and the push outbox (SPEC
        // section 10), as SQLite's version 6. Older nodes never read the
        // new columns or table, so it may run beside them.
        """
        ALTER TABLE devices ADD COLUMN push text;
        ALTER TABLE devices ADD COLUMN push_key text COLLATE "C";
        CREATE UNIQUE INDEX devices_by_push_key ON devices (app, push_key) WHERE push_key IS NOT NULL;

        CREATE TABLE push_outbox (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            app           text COLLATE "C" NOT NULL,
            user_id       text COLLATE "C" NOT NULL,
            device_id     text COLLATE "C" NOT NULL,
            kind          text NOT NULL,
            message       text NOT NULL,
            committed_at  bigint NOT NULL,
            due_at        bigint NOT NULL,
            claimed_until bigint NOT NULL DEFAULT 0,
            attempts      integer NOT NULL DEFAULT 0,
            generation    bigint NOT NULL DEFAULT 0
        );
        CREATE UNIQUE INDEX push_outbox_taps ON push_outbox (app, user_id, device_id) WHERE kind = 'tap';
        CREATE INDEX push_outbox_by_device ON push_outbox (app, user_id, device_id);
        CREATE INDEX push_outbox_due ON push_outbox (due_at);
        """,
        // 6: which of a node's partitions a user belongs to, as
        // `Partition.index` computes it (32-bit FNV-1a of app id, a zero
        // byte and user id): each partition's engine sweeps only its own
        // users' expired notifications. Older nodes never call it, so it
        // may run beside them.
        """
        CREATE FUNCTION herald_partition(app text, user_id text, partitions integer) RETURNS integer
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
        DECLARE
            bytes bytea := convert_to(app, 'UTF8') || decode('00', 'hex') || convert_to(user_id, 'UTF8');
            h bigint := 2166136261;
        BEGIN
            FOR i IN 0 .. length(bytes) - 1 LOOP
                h := ((h # get_byte(bytes, i)) * 16777619) & 4294967295;
            END LOOP;
            RETURN h % partitions;
        END
        $$;
        """,
        // 7: when each device's next tap may go, as SQLite's version 7.
        // Older nodes never read it, so it may run beside them.
        """
        CREATE TABLE push_tap_spacing (
            app        text COLLATE "C" NOT NULL,
            user_id    text COLLATE "C" NOT NULL,
            device_id  text COLLATE "C" NOT NULL,
            not_before bigint NOT NULL,
            PRIMARY KEY (app, user_id, device_id)
        );
        """,
        // 8: tokens every node signs with (an APNs provider token), by
        // name, as SQLite's version 8. Older nodes never read it.
        """
        CREATE TABLE shared_tokens (
            name      text COLLATE "C" PRIMARY KEY,
            value     text NOT NULL,
            issued_at bigint NOT NULL
        );
        """,
        // 9: the outbox's length (`herald_push_pending`), kept by statement
        // triggers in the transactions that add and remove its rows, so that
        // reading it is no scan of a long outbox: the sum of one row per
        // session that wrote some (`writer`, its backend's pid; 0 holds what
        // the migration found and what ended sessions left, folded in by
        // `PostgresStore.pendingPushes`). Each session moves only its own
        // row, so writers never wait for each other on it. The function
        // keeps this schema's search_path: a session of another deployment
        // or an operator's writing the outbox moves this count. Older
        // nodes' writes fire the triggers too, so it may run beside them.
        """
        CREATE TABLE push_outbox_size (
            writer integer PRIMARY KEY,
            pushes bigint NOT NULL
        );
        -- Older nodes' open writes finish first, and new ones wait for the
        -- triggers: a row written between the count and the triggers would
        -- be missed by both, and the count would drift for good.
        LOCK TABLE push_outbox IN SHARE ROW EXCLUSIVE MODE;
        INSERT INTO push_outbox_size SELECT 0, count(*) FROM push_outbox;
        CREATE FUNCTION herald_push_outbox_size() RETURNS trigger
        LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
        DECLARE
            moved bigint;
        BEGIN
            IF TG_OP = 'INSERT' THEN
                SELECT count(*) INTO moved FROM added;
            ELSE
                SELECT -count(*) INTO moved FROM removed;
            END IF;
            IF moved <> 0 THEN
                INSERT INTO push_outbox_size AS s (writer, pushes) VALUES (pg_backend_pid(), moved)
                ON CONFLICT (writer) DO UPDATE SET pushes = s.pushes + excluded.pushes;
            END IF;
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER push_outbox_added AFTER INSERT ON push_outbox REFERENCING NEW TABLE AS added
            FOR EACH STATEMENT EXECUTE FUNCTION herald_push_outbox_size();
        CREATE TRIGGER push_outbox_removed AFTER DELETE ON push_outbox REFERENCING OLD TABLE AS removed
            FOR EACH STATEMENT EXECUTE FUNCTION herald_push_outbox_size();
        """,
        // 10: seenState apart from readState (SPEC section 11), as SQLite's
        // version 11. What was stored before counts as its readState
        // implies (SeenState.implied, docs/PROTOCOL.md): read ones seen,
        // unread ones unseen; so the unseen counts start as the unread ones.
        // A change recorded before keeps NULL *_unseen, read as its
        // *_unread (StoredForm.presence). Older nodes would write
        // notifications and counts without it: they must stop first.
        """
        ALTER TABLE notifications ADD COLUMN seen_state text NOT NULL DEFAULT 'unseen';
        UPDATE notifications SET seen_state = 'seen' WHERE read_state = 'read';
        ALTER TABLE counts ADD COLUMN unseen bigint NOT NULL DEFAULT 0;
        UPDATE counts SET unseen = unread WHERE unread <> 0;
        ALTER TABLE changes ADD COLUMN before_unseen boolean, ADD COLUMN after_unseen boolean;
        """,
        // 11: snoozes that end (SPEC section 11), as SQLite's version 12:
        // nothing stored before had a time; the wake sweep finds the few
        // that have one in an index of only them.
        """
        ALTER TABLE notifications ADD COLUMN snoozed_until bigint;
        CREATE INDEX notifications_wake ON notifications (snoozed_until) WHERE snoozed_until IS NOT NULL;
        """,
        // 12: preferences (SPEC section 12).
        preferencesMigration,
        // 13: the webhook outbox (SPEC section 13), rows as the push
        // outbox's (OutboxSQL), one per event and endpoint. A new table:
        // older nodes never read it. Its length is kept as push_outbox_size
        // is (migration 9), by one function both outboxes' statement
        // triggers now call with their size table's name (its column is
        // named as push_outbox_size's). Renumbered by moving it alone.
        OutboxSQL.webhookTable(id: "bigserial PRIMARY KEY", integer: "bigint") + """
        CREATE TABLE webhook_outbox_size (writer integer PRIMARY KEY, pushes bigint NOT NULL);
        INSERT INTO webhook_outbox_size VALUES (0, 0);
        CREATE FUNCTION herald_outbox_size() RETURNS trigger
        LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
        DECLARE moved bigint;
        BEGIN
            IF TG_OP = 'INSERT' THEN SELECT count(*) INTO moved FROM added; ELSE SELECT -count(*) INTO moved FROM removed; END IF;
            IF moved <> 0 THEN
                EXECUTE format('INSERT INTO %I AS s (writer, pushes) VALUES (pg_backend_pid(), $1)'
                               ' ON CONFLICT (writer) DO UPDATE SET pushes = s.pushes + excluded.pushes', TG_ARGV[0]) USING moved;
            END IF;
            RETURN NULL;
        END $$;
        DROP TRIGGER push_outbox_added ON push_outbox;
        DROP TRIGGER push_outbox_removed ON push_outbox;
        DROP FUNCTION herald_push_outbox_size();
        """ + ["push_outbox", "webhook_outbox"].map { t in
            """
            CREATE TRIGGER \(t)_added AFTER INSERT ON \(t) REFERENCING NEW TABLE AS added
                FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_size('\(t)_size');
            CREATE TRIGGER \(t)_removed AFTER DELETE ON \(t) REFERENCING OLD TABLE AS removed
                FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_size('\(t)_size');

            """
        }.joined(),
    ]

    /// Preferences (SPEC section 12), as SQLite's version 13: one row per
    /// user that saved any, their wire form without `critical`.
    private static let preferencesMigration = """
        CREATE TABLE preferences (
            app         text NOT NULL,
            user_id     text NOT NULL,
            preferences text NOT NULL,
            PRIMARY KEY (app, user_id)
        );
        """

    /// The versions an older node would misread: since version 3 a
    /// notification's JSON is in its change, and an older node's pruning
    /// would drop changes notifications point at. Version 4 only adds a
    /// function older nodes never call, as does version 6; versions 7 and 8
    /// tables they never read; version 9 a table their writes keep too.
    /// Version 10: an older node's writes would leave `seen_state` and the
    /// unseen counts behind; version 11 `snoozed_until`, so a notification
    /// it dismissed would still wake. Version 12: an older node cannot read
    /// a feed holding a save of preferences.
    static let misreadByOlderNodes: Set<Int64> = [3, 10, 11, 12]

    /// Migrates through a version of `misreadByOlderNodes` only once every
    /// node on the database has stopped (`herald_nodes`, from version 2).
    private static func refuseWhileNodesRun(_ db: PostgresConnection, _ current: Int64) throws(StoreError) {
        guard current >= 2, ((current + 1)...version).contains(where: misreadByOlderNodes.contains) else { return }
        let running = try db.query("SELECT count(*) FROM herald_nodes WHERE lease_until > now()").int64(0, 0)
        guard running == 0 else {
            throw db.error("schema", "\(running) gateway node(s) or partitions of one are running on this database at schema version \(current); stop every node before upgrading it to \(version) (an older node would misread what this version writes). A stopped or crashed node's lease ends within 10 s. Nothing was changed.")
        }
    }

    /// Brings the database to the current version and returns its epoch,
    /// made by the first migration.
    static func migrate(_ db: PostgresConnection) throws(StoreError) -> String {
        // A node starting waits for another's migration however long it
        // takes (the session's lock_timeout is for frozen peers' row locks).
        try db.script("BEGIN; SET LOCAL lock_timeout = 0")
        do throws(StoreError) {
            try db.execute("SELECT pg_advisory_xact_lock($1)", [.int(migrationLock)])
            try db.script("""
                CREATE TABLE IF NOT EXISTS herald_schema (
                    version    bigint PRIMARY KEY,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )
                """)
            let current = try db.query("SELECT coalesce(max(version), 0) FROM herald_schema").int64(0, 0)
            if current > version {
                throw db.error("schema", "the database has schema version \(current), newer than the \(version) this Herald understands; refusing to use it (upgrade Herald). Nothing was changed.")
            }
            if current < version {
                try refuseWhileNodesRun(db, current)
                for v in (current + 1)...version {
                    try db.script(migrations[Int(v - 1)])
                    if v == 1 {
                        try db.execute("INSERT INTO herald_meta (key, value) VALUES ('epoch', $1), ('created_at', $2)",
                                       [.text("p-" + Random.hex(12)), .text(RFC3339.format(WallClock.now()))])
                    }
                    try db.execute("INSERT INTO herald_schema (version) VALUES ($1)", [.int(v)])
                }
            }
            let epoch = try db.query("SELECT value FROM herald_meta WHERE key = 'epoch'")
            guard epoch.count == 1, let e = epoch.text(0, 0), !e.isEmpty else {
                throw db.error("schema", "the database has no epoch (damaged?)")
            }
            try db.script("COMMIT")
            return e
        } catch {
            if db.inTransaction { _ = try? db.script("ROLLBACK") }
            throw error
        }
    }
}
