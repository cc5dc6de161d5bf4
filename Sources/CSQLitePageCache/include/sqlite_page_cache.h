#ifndef HERALD_SQLITE_PAGE_CACHE_H
#define HERALD_SQLITE_PAGE_CACHE_H

/// Wraps SQLite's default page cache so that a commit does not scan the
/// whole cache (see sqlite_page_cache.c). Takes effect only before SQLite is
/// initialized (before the process's first connection opens), so every code
/// that opens one calls it first; it installs once per process and returns
/// 0 on success, else SQLite's error (SQLITE_MISUSE when SQLite was already
/// initialized), in which case the default cache stays, unwrapped.
int herald_sqlite_page_cache_install(void);

/// Truncations the wrapper passed to SQLite's cache, and those it answered
/// itself because no page could be at or beyond the limit (for tests).
void herald_sqlite_page_cache_counts(long long *passed, long long *skipped);

#endif
