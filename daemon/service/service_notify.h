/* systemd's Type=notify protocol for the daemon, over libsystemd's sd_notify: READY=1 once
 * the listeners serve, STATUS= lines, STOPPING=1 when draining starts, and WATCHDOG=1 pings
 * from a libevent timer when the unit sets WatchdogSec=.
 *
 * Every function is a no-op returning 0 when NOTIFY_SOCKET is unset (ttd not started by
 * systemd, or by a unit of another Type). A failure to notify is logged at WARN and never
 * stops the daemon. The senders are thread-safe; the watchdog timer runs on the thread that
 * dispatches its event_base. */
#ifndef TTD_SERVICE_NOTIFY_H
#define TTD_SERVICE_NOTIFY_H

#include <event2/event.h>

/* Each returns 1 when the message was sent, 0 when NOTIFY_SOCKET is unset, and a negative
 * errno when sending failed (logged). The STATUS= text is printf-formatted and should be
 * one line. */
int ttd_notify_ready(const char *status_fmt, ...) __attribute__((format(printf, 1, 2)));    /* READY=1 */
int ttd_notify_stopping(const char *status_fmt, ...) __attribute__((format(printf, 1, 2))); /* STOPPING=1 */
int ttd_notify_status(const char *status_fmt, ...) __attribute__((format(printf, 1, 2)));   /* STATUS= only */
int ttd_notify_watchdog(void);                                                                /* WATCHDOG=1 */

typedef struct ttd_notify_watchdog_timer ttd_notify_watchdog_timer;

/* When NOTIFY_SOCKET is set and systemd asks for a watchdog (WATCHDOG_USEC, and WATCHDOG_PID
 * unset or this process), sends WATCHDOG=1 now and then every WATCHDOG_USEC / 2 from a
 * persistent timer on base, and returns the timer, which the caller owns and frees with
 * ttd_notify_watchdog_timer_free before freeing base. Returns NULL when no watchdog is
 * asked for, or (logged at ERROR) when the timer cannot be made. Pings stop when the loop
 * stops running: a stuck loop is what the watchdog is there to catch. */
ttd_notify_watchdog_timer *ttd_notify_watchdog_timer_create(struct event_base *base);

/* The ping period in microseconds (WATCHDOG_USEC / 2). */
unsigned long long ttd_notify_watchdog_timer_period_usec(const ttd_notify_watchdog_timer *timer);

void ttd_notify_watchdog_timer_free(ttd_notify_watchdog_timer *timer); /* accepts NULL */

#endif
