/* The tenants of a driver's ttd: a fresh random token each, written as a --tokens file
 * (digests only, as ttctl token new prints them). Not thread-safe. */
#ifndef TTD_FT_TENANTS_H
#define TTD_FT_TENANTS_H

#define FT_MAX_TENANTS 8

typedef struct ft_tenant {
  const char *name;    /* lent */
  const char *options; /* "admin", "quota=512M", "" (lent) */
  char token[64];      /* filled by ft_tenants_write */
  char env[80];        /* "TTD_TOKEN=<token>", for a client's environment */
} ft_tenant;

/* Gives each of the n tenants a token and writes the tokens file to path; 0, or -1. */
int ft_tenants_write(ft_tenant *tenants, int n, const char *path);

#endif
