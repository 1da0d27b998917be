CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL
                     REFERENCES customers(id), amount REAL NOT NULL);
INSERT INTO customers VALUES (1, 'Ada', 'Berlin'), (2, 'Bo', 'Oslo'), (3, 'Cy', 'Berlin'),
                             (4, 'Di', 'Lima'), (5, 'Ed', 'Quito');
INSERT INTO orders VALUES (1, 1, 10.5), (2, 1, 4.25), (3, 2, 30.0), (4, 3, 1.0),
                          (5, 4, 7.333), (6, 2, 0.5);
