/* log_db.c — a database's commit log for readers that take its records raw (log.h). Its own
 * file so that the accessor needs no change to db.c. */
#include "db_impl.h"
#include "log.h"

sto_log *sto_db_log(sto_db *db) {
    return db->log;
}
