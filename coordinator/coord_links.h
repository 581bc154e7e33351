/* coord_links.h - which links each candidate of a job measures in the
 * first round of profiling.
 *
 * The plan takes the median of each pair of sites (a site with itself
 * included), so for each pair one device measures up to COORD_LINK_SAMPLES
 * devices of the other side, one after another: the round's length grows
 * with the pairs of sites, not the devices, and no two measurements share a
 * site-to-site link at once (their shaping is per pair of sites). Each pair
 * gets as many samples as its sites allow (a site of one device measures
 * the others), and measurers and peers are spread: the fewest so far
 * first. Without every candidate's site, every candidate measures every
 * other. */
#ifndef COORD_LINKS_H
#define COORD_LINKS_H

#include "coord_job.h"

/* Whether every candidate's site is known. */
int coord_links_sites_known(const coord_cand *cand, int n);
/* Sets every candidate's measure[] for the first round. */
void coord_links_assign(coord_cand *cand, int n);
/* A device joining a running job (candidate k) measures up to
 * COORD_LINK_SAMPLES candidates of each site, its own included (the lost
 * left out): the pairs of sites it adds or joins. */
void coord_links_assign_joiner(coord_cand *cand, int n, int k);

#endif
