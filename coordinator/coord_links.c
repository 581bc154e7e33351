/* coord_links.c - which links each candidate of a job measures while it is
 * profiled (coord_links.h). Pure: candidates in, assignments out. */
#include "coord_links.h"

#include <stdlib.h>
#include <string.h>

#include "sl_mem.h"

/* The candidate of the pair of sites (a, b) (a == b: inside site a) that
 * measures it: the one with the most peers on the other side (up to
 * COORD_LINK_SAMPLES), then the fewest measurements so far; -1 if there is
 * no pair. */
static int link_measurer(const coord_cand *cand, int n, const int *load, const char *a, const char *b)
{
    int best = -1, best_peers = 0;
    for (int i = 0; i < n; i++) {
        const char *si = cand[i].site;
        int in_a = !strcmp(si, a), in_b = !strcmp(si, b);
        if (!in_a && !in_b)
            continue;
        const char *other = in_a ? b : a;
        int peers = 0;
        for (int q = 0; q < n; q++)
            peers += q != i && !strcmp(cand[q].site, other);
        peers = peers < COORD_LINK_SAMPLES ? peers : COORD_LINK_SAMPLES;
        if (peers > best_peers || (peers && peers == best_peers && load[i] < load[best])) {
            best = i;
            best_peers = peers;
        }
    }
    return best;
}

int coord_links_sites_known(const coord_cand *cand, int n)
{
    for (int i = 0; i < n; i++)
        if (!cand[i].site[0])
            return 0;
    return 1;
}

static void measure_reset(coord_cand *c, int n)
{
    free(c->measure);
    c->measure = sl_xcalloc((size_t)n + 1, sizeof *c->measure);
    c->nmeasure = 0;
}

/* Candidate k measures every other candidate. */
static void measure_all(coord_cand *cand, int n, int k)
{
    coord_cand *c = &cand[k];
    measure_reset(c, n);
    for (int q = 0; q < n; q++)
        if (q != k)
            c->measure[c->nmeasure++] = q;
}

void coord_links_assign(coord_cand *cand, int n)
{
    int known = coord_links_sites_known(cand, n);
    int *load = sl_xcalloc((size_t)n + 1, sizeof *load), *hit = sl_xcalloc((size_t)n + 1, sizeof *hit);
    for (int i = 0; i < n; i++) {
        if (known)
            measure_reset(&cand[i], n);
        else
            measure_all(cand, n, i);
    }
    for (int a = 0; a < n && known; a++) {
        const char *sa = cand[a].site;
        int first_a = 1;
        for (int x = 0; x < a; x++)
            first_a &= strcmp(cand[x].site, sa) != 0;
        for (int b = a; b < n && first_a; b++) {
            const char *sb = cand[b].site;
            int first_b = b == a || strcmp(sa, sb);
            for (int x = 0; x < b && first_b; x++)
                first_b = strcmp(cand[x].site, sb) != 0;
            int m = first_b ? link_measurer(cand, n, load, sa, sb) : -1;
            if (m < 0)
                continue;
            coord_cand *cm = &cand[m];
            const char *other = !strcmp(cm->site, sa) ? sb : sa;
            for (int k = 0; k < COORD_LINK_SAMPLES; k++) {
                int q = -1;
                for (int t = 0; t < n; t++) {
                    int taken = 0;
                    for (int u = 0; u < cm->nmeasure; u++)
                        taken |= cm->measure[u] == t;
                    if (t != m && !taken && !strcmp(cand[t].site, other) && (q < 0 || hit[t] < hit[q]))
                        q = t;
                }
                if (q < 0)
                    break;
                cm->measure[cm->nmeasure++] = q;
                load[m]++;
                hit[q]++;
            }
        }
    }
    free(load);
    free(hit);
}

void coord_links_assign_joiner(coord_cand *cand, int n, int k)
{
    if (!coord_links_sites_known(cand, n)) {
        measure_all(cand, n, k);
        return;
    }
    coord_cand *c = &cand[k];
    measure_reset(c, n);
    for (int q = 0; q < n; q++) {
        int same = 0;
        for (int u = 0; u < c->nmeasure; u++)
            same += !strcmp(cand[c->measure[u]].site, cand[q].site);
        if (q != k && !cand[q].lost_ms && same < COORD_LINK_SAMPLES)
            c->measure[c->nmeasure++] = q;
    }
}

