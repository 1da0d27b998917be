#!/bin/bash
set -euo pipefail
{
  echo "city,total"
  sqlite3 -csv /app/shop.db "SELECT c.city, printf('%.2f', SUM(o.amount)) AS total
    FROM customers c JOIN orders o ON o.customer_id = c.id
    GROUP BY c.city ORDER BY SUM(o.amount) DESC;"
} > /app/report.csv
