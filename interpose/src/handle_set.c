/* handle_set.c -- the small sets of handles the library keeps: NCCL streams
 * (nccl_streams.c), communicators (nccl_comms.c), and the streams, graphs and
 * executable graphs of graph capture (capture.c).
 *
 * A set is a short array and a high-water mark.  Lookups (handle_set_has in
 * interpose.h) are one lock-free scan, because a job has a handful of each;
 * additions and removals take the owner's mutex.  A removed entry is zeroed
 * and reused by a later addition.  A full set counts the handle in
 * `untracked` and says so once on stderr. */

#include "interpose.h"

int handle_set_add(struct handle_set *hs, uintptr_t key)
{
    if (handle_set_has(hs, key))
        return 0;
    pthread_mutex_lock(hs->lock);
    int n = atomic_load(&hs->count), slot = -1, added = 0;
    for (int i = 0; i < n && slot < 0; i++) {
        uintptr_t k = atomic_load(&hs->items[i]);
        if (k == key)
            slot = -2;                      /* added meanwhile */
        else if (k == 0)
            slot = i;
    }
    if (slot == -1 && n < hs->max)
        slot = n;
    if (slot >= 0) {
        atomic_store(&hs->items[slot], key);
        if (slot == n)
            atomic_store_explicit(&hs->count, n + 1, memory_order_release);
        added = 1;
    }
    pthread_mutex_unlock(hs->lock);
    if (slot == -1) {
        count(&counters.untracked);
        if (!atomic_exchange(&hs->reported, 1))
            ilog("more than %d %s: %p and later ones are not tracked", hs->max, hs->what,
                 (void *)key);
        return -1;
    }
    return added;
}

int handle_set_remove(struct handle_set *hs, uintptr_t key)
{
    if (!handle_set_has(hs, key))
        return 0;
    int removed = 0;
    pthread_mutex_lock(hs->lock);
    int n = atomic_load(&hs->count);
    for (int i = 0; i < n; i++)
        if (atomic_load(&hs->items[i]) == key) {
            atomic_store(&hs->items[i], 0);
            removed = 1;
        }
    pthread_mutex_unlock(hs->lock);
    return removed;
}
