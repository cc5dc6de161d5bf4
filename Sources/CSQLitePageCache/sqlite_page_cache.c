// SQLite's default page cache (pcache1) remembers the largest page number it
// has held since its last truncation, and every commit truncates to the
// database's size. A B-tree balance that reorders pages parks one under the
// page number of the locking page (1 GiB / page size + 1, never a real page)
// while it swaps keys, so after most batches that write random users the
// remembered maximum is ~262,145 and the commit walks the whole hash table:
// about 10 % of the engine thread under durable publishing (perf, 3,000/s).
// This wrapper keeps the true maximum beside it, counting a parked page
// apart, and skips a truncation that cannot remove anything. Everything
// else goes straight to SQLite's cache.
#include "sqlite_page_cache.h"
#include <pthread.h>
#include <sqlite3.h>

typedef struct {
    sqlite3_pcache *inner;
    unsigned maxKey;     // no page held has a larger number, parked ones aside
    unsigned parkKey;    // the locking page's number for this page size
    int parked;          // pages under parkKey now
} Cache;

static sqlite3_pcache_methods2 base;
static long long passedCount, skippedCount;

static int cacheInit(void *arg) { (void)arg; return base.xInit ? base.xInit(base.pArg) : SQLITE_OK; }
static void cacheShutdown(void *arg) { (void)arg; if (base.xShutdown) base.xShutdown(base.pArg); }

static sqlite3_pcache *cacheCreate(int szPage, int szExtra, int bPurgeable) {
    Cache *c = sqlite3_malloc(sizeof *c);
    if (!c) return 0;
    c->inner = base.xCreate(szPage, szExtra, bPurgeable);
    if (!c->inner) { sqlite3_free(c); return 0; }
    c->maxKey = 0;
    c->parkKey = 0x40000000u / (unsigned)szPage + 1;
    c->parked = 0;
    return (sqlite3_pcache *)c;
}

static Cache *unwrap(sqlite3_pcache *p) { return (Cache *)p; }

static void cacheCachesize(sqlite3_pcache *p, int n) { base.xCachesize(unwrap(p)->inner, n); }
static int cachePagecount(sqlite3_pcache *p) { return base.xPagecount(unwrap(p)->inner); }

static sqlite3_pcache_page *cacheFetch(sqlite3_pcache *p, unsigned key, int createFlag) {
    Cache *c = unwrap(p);
    sqlite3_pcache_page *page = base.xFetch(c->inner, key, createFlag);
    if (page && key > c->maxKey) c->maxKey = key;
    return page;
}

static void cacheUnpin(sqlite3_pcache *p, sqlite3_pcache_page *page, int discard) {
    base.xUnpin(unwrap(p)->inner, page, discard);
}

static void cacheRekey(sqlite3_pcache *p, sqlite3_pcache_page *page, unsigned oldKey, unsigned newKey) {
    Cache *c = unwrap(p);
    base.xRekey(c->inner, page, oldKey, newKey);
    if (oldKey == c->parkKey) c->parked--;
    if (newKey == c->parkKey) c->parked++;
    else if (newKey > c->maxKey) c->maxKey = newKey;
}

static void cacheTruncate(sqlite3_pcache *p, unsigned limit) {
    Cache *c = unwrap(p);
    if (c->parked <= 0 && c->maxKey < limit) {
        __atomic_add_fetch(&skippedCount, 1, __ATOMIC_RELAXED);
        return;
    }
    base.xTruncate(c->inner, limit);
    __atomic_add_fetch(&passedCount, 1, __ATOMIC_RELAXED);
    if (limit <= c->parkKey) c->parked = 0;
    if (limit > 0 && c->maxKey >= limit) c->maxKey = limit - 1;
}

static void cacheDestroy(sqlite3_pcache *p) {
    Cache *c = unwrap(p);
    base.xDestroy(c->inner);
    sqlite3_free(c);
}

static void cacheShrink(sqlite3_pcache *p) { base.xShrink(unwrap(p)->inner); }

static int installResult;

static void install(void) {
    static sqlite3_pcache_methods2 wrapper;
    installResult = sqlite3_config(SQLITE_CONFIG_GETPCACHE2, &base);
    if (installResult != SQLITE_OK) return;
    wrapper = (sqlite3_pcache_methods2){
        .iVersion = base.iVersion, .pArg = 0,
        .xInit = cacheInit, .xShutdown = cacheShutdown, .xCreate = cacheCreate,
        .xCachesize = cacheCachesize, .xPagecount = cachePagecount, .xFetch = cacheFetch,
        .xUnpin = cacheUnpin, .xRekey = cacheRekey, .xTruncate = cacheTruncate,
        .xDestroy = cacheDestroy, .xShrink = cacheShrink,
    };
    installResult = sqlite3_config(SQLITE_CONFIG_PCACHE2, &wrapper);
}

// Once per process: installing twice would wrap the wrapper.
int herald_sqlite_page_cache_install(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
    return installResult;
}

void herald_sqlite_page_cache_counts(long long *passed, long long *skipped) {
    *passed = __atomic_load_n(&passedCount, __ATOMIC_RELAXED);
    *skipped = __atomic_load_n(&skippedCount, __ATOMIC_RELAXED);
}
